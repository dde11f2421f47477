"""A private munged for tests: its own key (1 KiB from /dev/urandom, 0400), socket, pid, log and seed
files in a directory other users can traverse (their processes make credentials too). Started as
root, stopped (SIGTERM, then waited for) afterwards."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.waits import HANG_S

MUNGED = shutil.which("munged", path="/usr/sbin:/usr/bin:/sbin")


@dataclass
class Munged:
    dir: Path

    @property
    def socket(self) -> Path:
        return self.dir / "munge.socket"

    @property
    def key(self) -> Path:
        return self.dir / "munge.key"


def start_munged(d: Path, key: bytes | None = None) -> Munged:
    d.chmod(0o755)
    m = Munged(d)
    m.key.write_bytes(key if key is not None else os.urandom(1024))
    m.key.chmod(0o400)
    assert MUNGED is not None
    subprocess.run(
        [
            MUNGED,
            f"--socket={m.socket}",
            f"--key-file={m.key}",
            f"--pid-file={d / 'munged.pid'}",
            f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munged.seed'}",
        ],
        check=True,
        capture_output=True,
        timeout=HANG_S,
    )
    deadline = time.monotonic() + HANG_S  # the daemonised munged makes its socket just after
    while not m.socket.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return m


def stop_munged(m: Munged) -> None:
    pid_file = m.dir / "munged.pid"
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def munged() -> Iterator[Munged]:
    if MUNGED is None:
        pytest.skip("munged is not installed (Debian: apt install munge)")
    if os.geteuid() != 0:
        pytest.skip("the test munged runs as root")
    d = Path(tempfile.mkdtemp(prefix="calque-munge-", dir="/tmp"))
    m = start_munged(d)
    try:
        yield m
    finally:
        stop_munged(m)
        shutil.rmtree(d, ignore_errors=True)
