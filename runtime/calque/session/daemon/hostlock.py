"""A lock held across the daemon's threads and worker processes."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from calque.session.files import open_private, private_directory


class HostLock:
    """A lock held across threads and processes: a thread lock, then ``flock`` on a file."""

    def __init__(self, path: Path) -> None:
        private_directory(path.parent, "lock directory")
        self._thread_lock = threading.Lock()
        self._fd = open_private(path, os.O_RDWR, "lock file")

    def __enter__(self) -> HostLock:
        self._thread_lock.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._thread_lock.release()

    @contextlib.contextmanager
    def unless(self, done: Callable[[], bool]) -> Iterator[bool]:
        """Hold the lock and yield True, or yield False without taking the file lock when ``done()``
        is already true once this thread's turn comes (saves a flock pair per group-commit follower)."""
        with self._thread_lock:
            if done():
                yield False
                return
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield True
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)
