"""Processes the harness started, ended by pid (checked against their start time, so a reused pid
is never signalled)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def alive(pid: int, started: int | None = None) -> bool:
    """Running (not a zombie), and the same process when ``started`` is given."""
    fields = _stat(pid)
    if not fields or fields[0] == "Z":
        return False
    return started is None or int(fields[19]) == started


def send(pid: int, sig: int, started: int | None = None) -> bool:
    if not alive(pid, started):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def reap(pid: int) -> None:
    """Collect a child's exit status (a no-op for processes that are not our children)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def wait_gone(pids: Iterable[tuple[int, int | None]], timeout: float) -> bool:
    pending = list(pids)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for pid, _ in pending:
            reap(pid)
        pending = [(p, s) for p, s in pending if alive(p, s)]
        if pending:
            time.sleep(0.1)
    return not pending


def stop(pids: Iterable[tuple[int, int | None]], grace: float, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to each (pid, start time), wait up to ``grace`` seconds, then SIGKILL the rest."""
    targets = [(p, s) for p, s in pids if send(p, sig, s)]
    if wait_gone(targets, grace):
        return
    for p, s in targets:
        send(p, signal.SIGKILL, s)
    wait_gone(targets, 5.0)


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]
