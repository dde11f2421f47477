"""Which GPU backend this host uses: the ``gpu:`` section of the host configuration.

Read from ``$CALQUE_HOST_CONFIG`` or ``/etc/calque/host.yaml``; without a file the host uses NVML.
Other sections of the file belong to other layers and are ignored here. Example::

    gpu:
      backend: sim                 # nvml (default) | sim
      sim:
        state: /var/lib/calque/gpus.json
        instance_type: p4d.24xlarge  # or cards: [A100-40GB, A100-40GB]
        mig: true                    # start MIG-capable cards in MIG mode (only when creating)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from calque.configfile import read_mapping, validate
from calque.errors import UsageError
from calque.gpu.backend import GpuBackend
from calque.models.base import CalqueModel, VersionedModel

DEFAULT_HOST_CONFIG = Path("/etc/calque/host.yaml")
ENV_HOST_CONFIG = "CALQUE_HOST_CONFIG"


class SimHostConfig(CalqueModel):
    """A simulated host: its state file and, when the file does not exist yet, what to create."""

    state: Path
    cards: list[str] | None = None
    instance_type: str | None = None
    root: Path | None = Field(None, description="directory standing in for / (default: <state>.root)")
    mig: bool = False

    @field_validator("instance_type")
    @classmethod
    def _known_instance_type(cls, v: str | None) -> str | None:
        """A shape the catalog lacks is refused when the file is read, not when the simulator first starts."""
        from calque.gpu.catalog import load_catalog

        if v is not None:
            try:
                load_catalog().for_instance_type(v)
            except UsageError as exc:
                raise ValueError(str(exc)) from exc
        return v

    @field_validator("cards")
    @classmethod
    def _known_cards(cls, v: list[str] | None) -> list[str] | None:
        from calque.gpu.catalog import load_catalog

        for name in v or []:
            try:
                load_catalog().card(name)
            except UsageError as exc:
                raise ValueError(str(exc)) from exc
        return v

    @model_validator(mode="after")
    def _one_source(self) -> SimHostConfig:
        if self.cards and self.instance_type:
            raise ValueError("give sim.cards or sim.instance_type, not both")
        return self


class GpuHostConfig(VersionedModel):
    """The ``gpu:`` section of the host configuration."""

    version_label: ClassVar[str] = "host configuration"
    upgrade_hint: ClassVar[str] = "upgrade calque on this host, or write the file's older version"
    version: int = 1
    backend: Literal["nvml", "sim"] = "nvml"
    sim: SimHostConfig | None = None

    @model_validator(mode="after")
    def _sim_needs_state(self) -> GpuHostConfig:
        if self.backend == "sim" and self.sim is None:
            raise ValueError("gpu.backend is sim but gpu.sim.state is not set")
        return self


def load_gpu_config(path: Path | str | None = None) -> GpuHostConfig:
    """The host's GPU configuration from ``path``, ``$CALQUE_HOST_CONFIG`` or /etc/calque/host.yaml."""
    explicit = path is not None or ENV_HOST_CONFIG in os.environ
    p = Path(path) if path is not None else Path(os.environ.get(ENV_HOST_CONFIG, DEFAULT_HOST_CONFIG))
    if not p.exists():
        if explicit:
            raise UsageError(f"host configuration {p} does not exist; fix the path or {ENV_HOST_CONFIG}")
        return GpuHostConfig()
    doc = read_mapping(p, "host configuration", empty_ok=True)
    return validate(GpuHostConfig, doc.get("gpu") or {}, p, "gpu: section of host configuration")


def open_backend(config: GpuHostConfig | None = None) -> GpuBackend:
    """The backend the configuration selects (a missing simulator state file is created from it)."""
    cfg = config if config is not None else load_gpu_config()
    if cfg.backend == "sim":
        from calque.gpu.sim import SimGpu

        assert cfg.sim is not None
        if not cfg.sim.state.exists():
            if not (cfg.sim.cards or cfg.sim.instance_type):
                raise UsageError(
                    f"simulated GPU state {cfg.sim.state} does not exist and gpu.sim has neither cards "
                    "nor instance_type to create it from"
                )
            return SimGpu.create(
                cfg.sim.state,
                cfg.sim.cards,
                instance_type=cfg.sim.instance_type,
                root=cfg.sim.root,
                mig=cfg.sim.mig,
                replace=False,
            )
        return SimGpu(cfg.sim.state)
    from calque.gpu.nvml import NvmlBackend

    return NvmlBackend()
