"""The one protocol both GPU backends implement (NVML on hosts, the simulator in tests).

Read-side methods are what the session service needs; the GPU layer extends this protocol with the
MIG and MPS operations it applies. Errors are ``calque.errors`` subclasses, never raw NVML codes.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from calque.models import DeviceSample, GpuDevice, GpuInstance, GpuProcess, MigDevice


@runtime_checkable
class GpuReader(Protocol):
    """Read-only view of a host's GPUs."""

    def gpus(self) -> list[GpuDevice]:
        """Every GPU, in index order."""
        ...

    def mig_devices(self) -> list[MigDevice]:
        """Every MIG device (compute instance) on every GPU in MIG mode."""
        ...

    def processes(self) -> list[GpuProcess]:
        """Every compute process on every GPU and MIG device."""
        ...

    def utilisation(self) -> list[DeviceSample]:
        """How busy each GPU, MIG device and (on a GPU not in MIG mode) compute process was since the
        previous call (the first call measures a short interval itself). What the driver does not
        report is None (unknown); a caller must treat unknown as active."""
        ...


COMPUTE_MODES = ("DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED")


@runtime_checkable
class GpuBackend(GpuReader, Protocol):
    """Everything the GPU layer does to a host's GPUs: the reader plus MIG and compute-mode changes.

    Profile ids are the driver's GPU-instance profile ids (``nvidia-smi mig -lgip``, the catalog's
    ``profile_id``); a compute instance is named by how many compute slices it takes.
    Errors are ``calque.gpu.nvml_errors.GpuDriverError`` subclasses carrying the NVML code.
    """

    def driver_version(self) -> str:
        """The driver version (e.g. ``595.91.07``)."""
        ...

    def gpu_instances(self, index: int) -> list[GpuInstance]:
        """The GPU instances (with their compute instances) on one GPU in MIG mode."""
        ...

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """Request MIG on or off; it becomes current at the next GPU reset (see ``GpuDevice.mig_pending``)."""
        ...

    def reset_gpu(self, index: int) -> None:
        """Reset one GPU (applies a pending MIG mode; refused while anything holds the GPU)."""
        ...

    def create_gpu_instance(self, index: int, profile_id: int, start: int) -> GpuInstance:
        """Create a GPU instance of ``profile_id`` at placement ``start``."""
        ...

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        """Destroy a GPU instance (refused while it has compute instances)."""
        ...

    def create_compute_instance(self, index: int, gi_id: int, compute_slices: int) -> int:
        """Create a compute instance of ``compute_slices`` inside a GI; returns its CI id."""
        ...

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        """Destroy a compute instance (refused while processes run on it)."""
        ...

    def set_compute_mode(self, index: int, mode: str) -> None:
        """Set DEFAULT, EXCLUSIVE_PROCESS or PROHIBITED compute mode."""
        ...

    def capability_devices(self, mig: MigDevice) -> list[str]:
        """The ``/dev/nvidia-caps/nvidia-capN`` nodes a process needs to use ``mig`` (GI, then CI)."""
        ...
