"""Close a capability node the moment it appears or is opened: inotify on ``/dev/nvidia-caps``.

The driver (or nvidia-modprobe) creates a new MIG device's nodes world-readable (0444), and with
``DeviceFileModify: 1`` it may reset modes when a process opens a device. The timer's re-check
(``reassert_every``) would close such a node within seconds; this watcher checks a node within
milliseconds of its creation or of an open: a node of a live session is given back to its holder's
ACL, any other node becomes ``root 0400``. Whoever opened it in between is ended by the guard
(``guard.py``), which also learns here which nodes were opened (``IN_OPEN``), so that it walks
``/proc`` only for those.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("calque.session")

IN_OPEN = 0x020
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_Q_OVERFLOW = 0x4000
# Not IN_ATTRIB: every grant and revoke of the daemon's own would come back as events (a cost per
# checkout); a mode reset by the driver comes with an open (IN_OPEN), a hand-made one waits for the re-check.
_MASK = IN_MOVED_TO | IN_CREATE | IN_OPEN
_EVENT_HEADER = 16  # struct inotify_event: wd, mask, cookie, len (then the name)


class NodeWatch:
    def __init__(self, directory: Path, on_node: Callable[[Path, bool], None]) -> None:
        self.directory = directory
        self.on_node = on_node
        self._fd = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="session-node-watch", daemon=True)

    def start(self) -> bool:
        """Watch; False (and the timer's re-check alone) where inotify or the directory is missing."""
        if not self.directory.is_dir():
            return False
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            log.warning(
                "inotify unavailable (%s): new capability nodes close at the next re-check",
                os.strerror(ctypes.get_errno()),
            )
            return False
        if libc.inotify_add_watch(fd, os.fsencode(self.directory), _MASK) < 0:
            log.warning("cannot watch %s: %s", self.directory, os.strerror(ctypes.get_errno()))
            os.close(fd)
            return False
        self._fd = fd
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                continue
            for name, opened in sorted(_events(data, self.directory)):
                try:
                    self.on_node(self.directory / name, opened)
                except Exception:
                    log.exception("cannot secure capability node %s", name)


def _events(data: bytes, directory: Path) -> set[tuple[str, bool]]:
    """(name, opened) per event: opened for IN_OPEN, else created or changed. A queue overflow
    (events lost) counts as every node of the directory opened and changed."""
    out = set()
    off = 0
    while off + _EVENT_HEADER <= len(data):
        mask = int.from_bytes(data[off + 4 : off + 8], "little")
        length = int.from_bytes(data[off + 12 : off + 16], "little")
        raw = data[off + _EVENT_HEADER : off + _EVENT_HEADER + length].rstrip(b"\0")
        off += _EVENT_HEADER + length
        if mask & IN_Q_OVERFLOW:
            try:
                every = os.listdir(directory)
            except OSError:
                continue
            out |= {(n, o) for n in every for o in (True, False)}
        elif raw:
            out.add((os.fsdecode(raw), bool(mask & IN_OPEN)))
    return out
