"""The daemon's slice inventory (``calque.session.slices``), cached against the layout's stamp.

The session service only reads GPU state (``GpuReader``); laying slices out is the GPU layer's job.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from calque.errors import CalqueError
from calque.gpu.backend import GpuReader
from calque.models import GpuProcess
from calque.models.session import Slice
from calque.session.daemon.wire import RequestError
from calque.session.session_config import SessionConfig
from calque.session.slices import gpu_selection, inventory

# Only for backends without a layout stamp (NVML); the simulator's layout is checked on every request.
INVENTORY_MAX_AGE_S = 2.0


def host_root(config: SessionConfig, reader: GpuReader | None) -> Path:
    """Where the capability files live: the config's ``host_root``, else the simulator's root, else /."""
    if config.host_root is not None:
        return config.host_root
    root = getattr(reader, "root", None)
    return Path(root) if isinstance(root, (str, Path)) else Path("/")


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
