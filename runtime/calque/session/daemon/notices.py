"""Notices to a holder's terminals, through the holder's own descriptors.

A path such as ``/dev/pts/3`` read with ``readlink`` means whatever it names in the daemon's mount
namespace, which need not be the holder's terminal (a container's devpts, a namespace of the
holder's making). Opening ``/proc/PID/fd/N`` instead reopens the very file the holder's process has
open, wherever it lives; and the terminal is written to only when it is a terminal the holder owns.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from calque.session.daemon.inventory import owner_of


def _write_to(path: str, uid: int, message: bytes) -> tuple[int, int] | None:
    """Write to the tty behind ``path`` if the holder owns it; returns its identity, None if not written."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISCHR(st.st_mode) or st.st_uid != uid or not os.isatty(fd):
            return None
        os.write(fd, message)
        return (st.st_dev, st.st_rdev)
    except OSError:
        return None
    finally:
        os.close(fd)


def notify_terminals(uid: int, message: str) -> int:
    """Write ``message`` once to every terminal the user owns and has a process on; returns how many."""
    data = f"\r\n[calque session] {message}\r\n".encode()
    seen: set[tuple[int, int]] = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or owner_of(int(d.name)) != uid:
            continue
        for n in ("0", "1", "2"):
            path = f"/proc/{d.name}/fd/{n}"
            try:
                st = os.stat(path)  # follows the descriptor itself, not a path name
            except OSError:
                continue
            if not stat.S_ISCHR(st.st_mode) or st.st_uid != uid or (st.st_dev, st.st_rdev) in seen:
                continue
            wrote = _write_to(path, uid, data)
            if wrote is not None:
                seen.add(wrote)
    return len(seen)


def notify_server_logs(pids: list[int], uid: int, session_id: str, message: str) -> int:
    """Append ``message`` to the log of each notebook server among ``pids`` (the session's cgroup): the
    file its stderr is, reopened through ``/proc/PID/fd/2`` (the very file, never a path name), only
    when it is a regular file the holder owns, named as ``notebook.py`` names the server's log. So the
    notebook's user reads the expiry and idle warnings in the server's log too; returns how many."""
    data = f"[calque session] {message}\n".encode()
    name = f"notebook-{session_id}.log"
    seen: set[tuple[int, int]] = set()
    for pid in pids:
        path = f"/proc/{pid}/fd/2"
        try:
            if os.path.basename(os.readlink(path)) != name:
                continue
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == uid and (st.st_dev, st.st_ino) not in seen:
                os.write(fd, data)
                seen.add((st.st_dev, st.st_ino))
        except OSError:
            continue
        finally:
            os.close(fd)
    return len(seen)
