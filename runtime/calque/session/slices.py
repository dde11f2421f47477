"""The slices a session config makes on this host: every MIG device the GPU backend reports, plus
the configured MPS slots (refused where the config names a GPU the host lacks, or one in MIG mode).

Shared by the daemon (``session/daemon/inventory.py`` caches it) and ``calque config check session``
(which checks a file against this host exactly as the daemon would start on it), so it lives beside
``session_config.py``, outside both rooms.
"""

from __future__ import annotations

from calque.errors import UsageError
from calque.gpu.backend import GpuReader
from calque.gpu.selection import GpuSelection, open_reader
from calque.models import GpuDevice
from calque.models.session import Slice
from calque.session.session_config import SessionConfig


def gpu_selection(config: SessionConfig) -> GpuSelection:
    """The config's backend in the GPU layer's shared vocabulary (``calque.gpu.selection``)."""
    return GpuSelection(config.gpu_backend, sim_state=config.sim_state, host_config=config.host_config)


def load_reader(config: SessionConfig) -> GpuReader | None:
    """The backend the config names; None for ``none`` (MPS slots only, no process tracking)."""
    return open_reader(gpu_selection(config))


def mig_slices(reader: GpuReader) -> list[Slice]:
    out = []
    for d in reader.mig_devices():
        out.append(
            Slice(
                id=d.uuid,
                kind="mig",
                gpu_index=d.gpu_index,
                gpu_uuid=d.gpu_uuid,
                profile=d.profile,
                mig_uuid=d.uuid,
                gpu_minor=d.gpu_minor,
                gi_id=d.gi_id,
                ci_id=d.ci_id,
                memory_mib=d.memory_mib,
            )
        )
    return sorted(out, key=lambda s: (s.gpu_index, s.gi_id or 0, s.ci_id or 0, s.id))


def mps_slices(config: SessionConfig, gpus: list[GpuDevice]) -> list[Slice]:
    by_index = {g.index: g for g in gpus}
    out = []
    for m in config.mps:
        g = by_index.get(m.gpu)
        if gpus and g is None:
            raise UsageError(f"mps config names GPU {m.gpu}, but this host has GPUs {sorted(by_index)}")
        if g is not None and g.mig_current:
            raise UsageError(
                f"mps config names GPU {m.gpu}, which is in MIG mode: its MIG devices are the slices there; "
                "remove it from mps: or turn MIG off with calque gpu"
            )
        pipe = m.pipe_directory or str(config.mps_pipe_root / f"gpu{m.gpu}")
        for k in range(m.slots):
            out.append(
                Slice(
                    id=f"mps-gpu{m.gpu}-slot{k}",
                    kind="mps",
                    gpu_index=m.gpu,
                    gpu_uuid=g.uuid if g else f"GPU-index-{m.gpu}",
                    profile="mps",
                    slot=k,
                    memory_mib=m.pinned_mem_limit_mib,
                    active_thread_percentage=m.active_thread_percentage,
                    pinned_mem_limit_mib=m.pinned_mem_limit_mib,
                    pipe_directory=pipe,
                    log_directory=m.log_directory or str(config.mps_log_root / f"gpu{m.gpu}"),
                )
            )
    return out


def inventory(config: SessionConfig, reader: GpuReader | None) -> list[Slice]:
    if reader is None:
        return mps_slices(config, [])
    return mig_slices(reader) + mps_slices(config, reader.gpus())
