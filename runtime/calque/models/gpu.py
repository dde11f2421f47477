"""What the GPU layer reports (Layer 2): GPUs, MIG devices and processes, backend-independent.

The NVML backend and the simulator both return these; the session service builds its slice
inventory from them. Owned by the GPU layer; extend here rather than re-declaring elsewhere.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from calque.models.base import CalqueModel


class GpuProcess(CalqueModel):
    """A compute process running on a GPU or on one MIG device."""

    pid: int = Field(ge=1)
    used_memory_mib: int = Field(0, ge=0)
    device_uuid: str = Field(description="GPU-... or MIG-... UUID the process runs on")


class MigDevice(CalqueModel):
    """One MIG device: a compute instance inside a GPU instance, addressable by its UUID."""

    gpu_index: int = Field(ge=0)
    gpu_uuid: str
    gpu_minor: int = Field(ge=0, description="/dev/nvidia<minor> of the parent GPU")
    profile: str = Field(description="GPU-instance profile name, e.g. 1g.10gb")
    profile_id: int = Field(ge=0, description="NVML GPU-instance profile id (nvidia-smi mig -lgip)")
    placement_start: int = Field(ge=0)
    placement_size: int = Field(ge=1)
    gi_id: int = Field(ge=0)
    ci_id: int = Field(ge=0)
    ci_profile: str | None = Field(None, description="compute-instance profile when split, e.g. 1c.2g.20gb")
    uuid: str = Field(pattern=r"^MIG-", description="CUDA_VISIBLE_DEVICES value")
    memory_mib: int = Field(0, ge=0)
    sms: int | None = None


class GpuDevice(CalqueModel):
    """One physical GPU."""

    index: int = Field(ge=0)
    name: str
    uuid: str = Field(pattern=r"^GPU-")
    minor: int = Field(ge=0)
    memory_mib: int = Field(ge=0)
    card: str | None = Field(None, description="catalog key, e.g. A100-SXM4-80GB; None when unknown")
    mig_current: bool
    mig_pending: bool
    persistence_mode: bool = False
    compute_mode: str = "DEFAULT"


class ComputeInstance(CalqueModel):
    """A compute instance inside a GPU instance (one MIG device)."""

    ci_id: int = Field(ge=0)
    compute_slices: int = Field(ge=1)
    profile: str | None = Field(None, description="CI profile when the GI is split, e.g. 1c.3g.20gb")
    uuid: str | None = Field(None, description="MIG-... UUID of the MIG device")


class GpuInstance(CalqueModel):
    """A GPU instance (a MIG partition) at one placement on a GPU's memory-slice grid."""

    gpu_index: int = Field(ge=0)
    gi_id: int = Field(ge=0)
    profile: str
    profile_id: int = Field(ge=0)
    placement_start: int = Field(ge=0)
    placement_size: int = Field(ge=1)
    compute_instances: list[ComputeInstance] = Field(default_factory=list)


SampleKind = Literal["gpu", "mig", "process"]


class DeviceSample(CalqueModel):
    """How busy one device was over the last sampling interval, as the driver reports it.

    One per whole GPU (``gpu``), per MIG device (``mig``) and per compute process of a GPU not in MIG
    mode (``process``: an MPS client, where the driver reports per-process use). A percentage the
    driver did not report is None, *unknown*, and unknown counts as active: nothing is reclaimed on a
    guess (A100 MIG devices have no GPM, so their activity is always unknown).
    """

    device_uuid: str = Field(description="GPU-... or MIG-... UUID (for a process: the GPU it runs on)")
    kind: SampleKind
    pid: int | None = Field(None, ge=1, description="process samples only")
    sm_percent: float | None = Field(None, ge=0, le=100, description="share of SMs busy (GPM SM_UTIL)")
    graphics_percent: float | None = Field(
        None, ge=0, le=100, description="share of time any kernel ran (GPM GRAPHICS_UTIL, utilisation rates' gpu)"
    )
    memory_used_mib: int | None = Field(None, ge=0)
    source: str = Field(description="what measured it: gpm, utilization-rates, process-utilization, sim, none")

    @property
    def active_percent(self) -> float | None:
        """The larger of the two activities (a kernel running on few SMs is still running); None: unknown."""
        known = [v for v in (self.sm_percent, self.graphics_percent) if v is not None]
        return max(known) if known else None
