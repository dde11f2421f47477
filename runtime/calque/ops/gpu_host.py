"""The options every GPU operation takes to pick its backend: a host configuration, or a simulator state."""

from __future__ import annotations

from calque.gpu.backend import GpuBackend
from calque.models.base import CalqueModel


class GpuHostRequest(CalqueModel):
    """Base of GPU requests: ``sim_state`` selects the simulator, else ``host_config`` (default file, else NVML)."""

    host_config: str | None = None
    sim_state: str | None = None

    def backend(self) -> GpuBackend:
        from calque.gpu.hostconfig import GpuHostConfig, SimHostConfig, load_gpu_config, open_backend

        if self.sim_state:
            return open_backend(GpuHostConfig(backend="sim", sim=SimHostConfig(state=self.sim_state)))
        return open_backend(load_gpu_config(self.host_config))
