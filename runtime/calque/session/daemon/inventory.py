"""The slice inventory: every MIG device the GPU backend reports, plus the configured MPS slots.

The session service only reads GPU state (``GpuReader``); laying slices out is the GPU layer's job.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from calque.errors import CalqueError, UsageError
from calque.gpu.backend import GpuReader
from calque.gpu.selection import GpuSelection, open_reader
from calque.models import GpuDevice, GpuProcess
from calque.models.session import Slice
from calque.session.config import SessionConfig
from calque.session.daemon.wire import RequestError

# Only for backends without a layout stamp (NVML); the simulator's layout is checked on every request.
INVENTORY_MAX_AGE_S = 2.0


def gpu_selection(config: SessionConfig) -> GpuSelection:
    """The config's backend in the GPU layer's shared vocabulary (``calque.gpu.selection``)."""
    return GpuSelection(config.gpu_backend, sim_state=config.sim_state, host_config=config.host_config)


def load_reader(config: SessionConfig) -> GpuReader | None:
    """The backend the config names; None for ``none`` (MPS slots only, no process tracking)."""
    return open_reader(gpu_selection(config))


def host_root(config: SessionConfig, reader: GpuReader | None) -> Path:
    """Where the capability files live: the config's ``host_root``, else the simulator's root, else /."""
    if config.host_root is not None:
        return config.host_root
    root = getattr(reader, "root", None)
    return Path(root) if isinstance(root, (str, Path)) else Path("/")


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


def layout_stamp(config: SessionConfig) -> tuple[int, ...] | None:
    """A cheap fingerprint of the GPU layout, taken before reading it; None where there is none.

    The simulator replaces its state file (write + rename) on every change, so (inode, mtime, size)
    changes with the layout; without a GPU backend the slices come from the config alone. NVML has
    no such counter: its callers fall back to re-reading after a short age.
    """
    if config.gpu_backend == "none":
        return ()
    if gpu_selection(config).effective == "sim" and config.sim_state is not None:
        st = os.stat(config.sim_state)
        return (st.st_ino, st.st_mtime_ns, st.st_size)
    return None


def inventory(config: SessionConfig, reader: GpuReader | None) -> list[Slice]:
    if reader is None:
        return mps_slices(config, [])
    return mig_slices(reader) + mps_slices(config, reader.gpus())


def processes_on(reader: GpuReader | None, sl: Slice, uid: int | None = None) -> list[int]:
    """Pids running on the slice (for MPS: on its GPU and owned by ``uid``), from the GPU backend."""
    if reader is None:
        return []
    return pids_on(reader.processes(), sl, uid)


def pids_on(procs: list[GpuProcess], sl: Slice, uid: int | None = None) -> list[int]:
    """The pids of ``procs`` that run on the slice (and belong to ``uid`` when given)."""
    if sl.kind == "mig":
        pids = [p.pid for p in procs if p.device_uuid == sl.mig_uuid]
    else:
        pids = [p.pid for p in procs if p.device_uuid == sl.gpu_uuid]
    if uid is not None:
        pids = [p for p in pids if owner_of(p) == uid]
    return sorted(set(pids))


def owner_of(pid: int) -> int | None:
    """Real uid of a live process; None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class SliceInventory:
    """The host's slices as the GPU backend and the config say, cached: rebuilding reads and validates
    the whole GPU state, so it happens only when the layout stamp changed (one stat), or, with no
    stamp, when the last read is older than INVENTORY_MAX_AGE_S. The stamp is taken before the read,
    so a change during it is seen next time."""

    def __init__(self, config: SessionConfig, reader: GpuReader | None) -> None:
        self._config = config
        self._reader = reader
        self._lock = threading.Lock()
        self._slices: list[Slice] = []
        self._at = 0.0
        self._stamp: tuple[int, ...] | None = None

    def slices(self, fresh: bool = False) -> list[Slice]:
        with self._lock:
            now = time.monotonic()
            try:
                stamp = layout_stamp(self._config)
            except OSError:
                stamp, fresh = None, True  # let the read itself report what is wrong
            stale = (
                stamp != self._stamp if stamp is not None else (not self._at or now - self._at > INVENTORY_MAX_AGE_S)
            )
            if fresh or stale:
                self._stamp = None
                try:
                    self._slices = inventory(self._config, self._reader)
                except CalqueError:
                    raise
                except Exception as exc:
                    raise RequestError("internal", f"cannot read the GPU inventory: {exc}") from exc
                self._at = now
                self._stamp = stamp
            return list(self._slices)
