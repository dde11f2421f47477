"""Scale-in protection before the first session: the hand-over between an elastic host's session
daemon and its fleet helper (``calque session fleet protect --guard DIR``), through files in one
directory (``scale_in_guard`` in session.yaml names the same one).

- ``protected``: the helper's word, ``1`` or ``0``: whether the instance is protected from scale-in now.
- ``wanted``: the time the daemon last found the instance unprotected at a checkout; the helper sees
  it within a fraction of a second and protects the instance before the checkout goes on.
- ``granted``: the time of the daemon's last grant, written under the lock after the grant commits.
- ``lock``: ``flock``ed by the daemon around "protected, so grant" and by the helper around "nothing
  was granted since I counted no live session, so write ``protected`` 0" (its AWS call comes after,
  outside the lock: a checkout never waits on AWS behind the lock). A grant after the helper counted
  is seen by the helper, and a lift before a grant is seen by the daemon, which then asks again.

The daemon never calls AWS (Layer 2); the helper does, as it always has.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path


class ScaleInGuard:
    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def prepare(self) -> None:
        """The directory (root's, 0700): the helper makes it at its start."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # the lock goes with the descriptor

    def protected(self) -> bool:
        try:
            return (self.dir / "protected").read_text().strip() == "1"
        except OSError:
            return False

    def set_protected(self, protected: bool) -> None:
        tmp = self.dir / "protected.tmp"
        tmp.write_text("1\n" if protected else "0\n")
        tmp.replace(self.dir / "protected")

    def mark(self, name: str) -> None:
        """``wanted`` or ``granted`` now (the time itself, not the file's mtime: the kernel's is coarser)."""
        tmp = self.dir / f"{name}.tmp.{os.getpid()}"
        with contextlib.suppress(OSError):
            tmp.write_text(repr(time.time()))
            tmp.replace(self.dir / name)

    def marked_at(self, name: str) -> float:
        """When ``name`` was last marked (0: never, or unreadable)."""
        try:
            return float((self.dir / name).read_text())
        except (OSError, ValueError):
            return 0.0
