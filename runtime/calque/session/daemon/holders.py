"""Who holds a slice's nodes open: every descriptor under ``/proc/*/fd``, matched by the file itself.

chown, chmod and ACLs never revoke a descriptor already open, and NVIDIA's capability check
(``nv_cap_validate_and_dup_fd``) does not re-check permissions; so whoever holds a node they may no
longer use is ended (``guard.py`` decides which nodes to walk for, and when). A real node is a
character device, matched by its device number (``st_rdev``: any path to the same device, in any
mount namespace); the simulator's nodes are plain files, matched by ``(st_dev, st_ino)``.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from calque.session.daemon.inventory import owner_of

log = logging.getLogger("calque.session")

Key = tuple[int, ...]


def key_of(st: os.stat_result) -> Key:
    if stat.S_ISCHR(st.st_mode):
        return (0, st.st_rdev)
    return (1, st.st_dev, st.st_ino)


def keys_of(paths: Iterable[Path]) -> dict[Key, Path]:
    out = {}
    for p in paths:
        try:
            out[key_of(os.stat(p))] = p
        except OSError:
            continue
    return out


def holders(keys: dict[Key, Path]) -> dict[int, set[Path]]:
    """pid -> the nodes (of ``keys``) it holds open."""
    found: dict[int, set[Path]] = {}
    if not keys:
        return found
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        fds = f"/proc/{name}/fd"
        try:
            entries = os.listdir(fds)
        except OSError:
            continue
        for fd in entries:
            try:
                k = key_of(os.stat(f"{fds}/{fd}"))
            except OSError:
                continue
            node = keys.get(k)
            if node is not None:
                found.setdefault(int(name), set()).add(node)
    return found


def end_holders(found: dict[int, set[Path]], keep_uid: int | None = None, wait: float = 1.0) -> list[int]:
    """SIGKILL every holder in ``found`` except root's processes and ``keep_uid``'s; returns the pids."""
    hit = []
    for pid in sorted(found):
        uid = owner_of(pid)
        if uid is None or uid == keep_uid:
            continue
        if uid == 0:  # the driver's helpers (persistenced, MPS control) are root's: named, never killed
            log.warning("pid %d (root) holds %s open; not ending it", pid, ", ".join(map(str, sorted(found[pid]))))
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            hit.append(pid)
            log.warning("ended pid %d (uid %d): it held %s open", pid, uid, ", ".join(map(str, sorted(found[pid]))))
        except (ProcessLookupError, PermissionError):
            continue
    deadline = time.monotonic() + wait
    while hit and time.monotonic() < deadline and any(_running(p) for p in hit):
        time.sleep(0.01)
    return hit


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
