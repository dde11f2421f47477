"""Stopping the processes on MIG instances that a forced layout destroys (on a real host)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from calque.gpu.nvml_errors import GpuDriverError
from calque.models import GpuProcess
from calque.processes import pid_alive


def terminate_processes(procs: list[GpuProcess], timeout_s: float = 10.0) -> None:
    """Stop processes on a real host: SIGTERM, wait up to ``timeout_s``, then SIGKILL."""
    pids = {p.pid for p in procs}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            raise GpuDriverError(4, f"cannot stop pid {pid} on the GPU: {exc}") from exc
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        pids = {pid for pid in pids if pid_alive(pid)}
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
