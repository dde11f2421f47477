"""The options every GPU operation takes to pick its backend, in the words of ``calque.gpu.selection``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from calque.gpu.backend import GpuBackend
from calque.models.base import CalqueModel


class GpuHostRequest(CalqueModel):
    """Base of GPU requests: ``gpu_backend`` names the backend (host, nvml or sim), opened by ``open_gpu``.

    ``host`` reads the host configuration (``host_config``, else the default file, else NVML);
    ``sim_state`` alone (with the default ``host``) means the simulator.
    """

    gpu_backend: Literal["host", "nvml", "sim"] = "host"
    host_config: str | None = None
    sim_state: str | None = None

    def backend(self) -> GpuBackend:
        from calque.gpu.selection import GpuSelection, open_gpu

        return open_gpu(
            GpuSelection(
                self.gpu_backend,
                sim_state=Path(self.sim_state) if self.sim_state else None,
                host_config=Path(self.host_config) if self.host_config else None,
            )
        )
