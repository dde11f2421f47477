"""The one protocol both GPU backends implement (NVML on hosts, the simulator in tests).

Read-side methods are what the session service needs; the GPU layer extends this protocol with the
MIG and MPS operations it applies. Errors are ``calque.errors`` subclasses, never raw NVML codes.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from calque.models import GpuDevice, GpuProcess, MigDevice


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
