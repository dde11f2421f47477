"""Which GPU backend to open: the one vocabulary and the one resolver.

The CLI (``--gpu-backend``, ``--sim-state``, ``--host-config``), the Ansible modules (``gpu_backend``,
``sim_state``, ``host_config``) and the session configuration (``gpu_backend``, ``sim_state``,
``host_config``) all name a backend with these words, and all open it through ``open_gpu``:

* ``host``: whatever the host configuration says (``gpu.backend: nvml | sim`` in
  ``$CALQUE_HOST_CONFIG`` or ``/etc/calque/host.yaml``; NVML without a file). The default.
* ``nvml``: the NVIDIA driver, whatever the host configuration says.
* ``sim``: a simulated host: the state file ``sim_state``, else the host configuration's ``gpu.sim``.
* ``none``: no GPU at all (the session service offering MPS slots only).

``sim_state`` given with the default ``host`` means ``sim``: pointing at a state file is enough.
Light on purpose (no pydantic): the CLI imports it to build its options.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from calque.errors import UsageError

if TYPE_CHECKING:
    from calque.gpu.backend import GpuBackend

Backend = Literal["host", "nvml", "sim", "none"]
BACKENDS: tuple[str, ...] = get_args(Backend)


@dataclass(frozen=True)
class GpuSelection:
    """A backend named in the shared vocabulary, with the files it may need."""

    backend: Backend = "host"
    sim_state: Path | None = None
    host_config: Path | None = None

    @property
    def effective(self) -> Backend:
        return "sim" if self.backend == "host" and self.sim_state is not None else self.backend


def open_reader(sel: GpuSelection) -> GpuBackend | None:
    """The backend ``sel`` names; None for ``none``."""
    from calque.gpu.hostconfig import load_gpu_config, open_backend

    kind = sel.effective
    if kind == "none":
        return None
    if kind == "nvml":
        from calque.gpu.nvml import NvmlBackend

        return NvmlBackend()
    if kind == "sim":
        if sel.sim_state is not None:
            from calque.gpu.sim import SimGpu

            return SimGpu(sel.sim_state)
        cfg = load_gpu_config(sel.host_config)
        if cfg.sim is None:
            raise UsageError(
                "gpu backend sim needs a simulator state file: give sim_state (--sim-state) "
                "or gpu.sim.state in the host configuration"
            )
        return open_backend(cfg.model_copy(update={"backend": "sim"}))
    return open_backend(load_gpu_config(sel.host_config))


def open_gpu(sel: GpuSelection) -> GpuBackend:
    """The backend ``sel`` names, where a GPU is needed (``none`` is a usage error)."""
    backend = open_reader(sel)
    if backend is None:
        raise UsageError(f"this needs a GPU backend; choose one of {', '.join(b for b in BACKENDS if b != 'none')}")
    return backend


def sim_state_path(sel: GpuSelection) -> Path:
    """The simulator state file ``sel`` names: ``sim_state``, else the host configuration's ``gpu.sim.state``."""
    if sel.sim_state is not None:
        return sel.sim_state
    from calque.gpu.hostconfig import load_gpu_config

    cfg = load_gpu_config(sel.host_config)
    if cfg.sim is None:
        raise UsageError("no simulated host named: give --sim-state PATH or gpu.sim.state in the host configuration")
    return cfg.sim.state
