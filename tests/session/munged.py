"""A private munged for tests: its own key (1024 random bytes, 0400), socket, log, pid and seed files
in a directory of its own, stopped afterwards. Two munged with the same key are two hosts of one
institution; one with another key is a forger's."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Munged:
    dir: Path
    key: Path

    @property
    def socket(self) -> Path:
        return self.dir / "munge.sock"


def new_key(path: Path) -> Path:
    path.write_bytes(os.urandom(1024))
    path.chmod(0o400)
    return path


@contextmanager
def munged(key: Path | None = None) -> Iterator[Munged]:
    """A munged on a socket of its own (its directory other users can reach: clients run as test users)."""
    d = Path(tempfile.mkdtemp(prefix="calque-munge-", dir="/tmp"))
    d.chmod(0o755)
    if key is None:
        key = new_key(d / "munge.key")
    m = Munged(d, key)
    args = [
        "munged",
        "--force",
        f"--key-file={key}",
        f"--socket={m.socket}",
        f"--log-file={d / 'munged.log'}",
        f"--pid-file={d / 'munged.pid'}",
        f"--seed-file={d / 'munged.seed'}",
    ]
    subprocess.run(args, check=True, capture_output=True, timeout=30)
    try:
        deadline = time.monotonic() + 10
        while not m.socket.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        yield m
    finally:
        subprocess.run(["munged", "--stop", f"--socket={m.socket}"], capture_output=True, timeout=30)
        shutil.rmtree(d, ignore_errors=True)
