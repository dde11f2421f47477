"""Whether an MPS control daemon answers at its pipe directory, asked without its control program.

The control daemon listens on ``<pipe directory>/control``: a Unix socket on the drivers calque runs
on (its log says "Starting control daemon using socket <dir>/control"), a named pipe on old ones. A
daemon that died (a crash, SIGKILL, ``quit`` from someone else) may leave the file behind, so the
file's existence says nothing: the probe connects (a socket) or opens it for writing without blocking
(a FIFO, which succeeds only while a process holds it open for reading). It sends nothing, so it
works with the real daemon and the tests' stand-in alike; the real daemon logs such a connection as
one that "did not send valid credentials" and carries on.

This is the GPU layer's answer to "is MPS up on GPU N", whatever the GPU backend: NVML cannot tell
(an MPS daemon is a process beside the driver, not its state), and the simulator's hosts run a real
stand-in control daemon (``tests/gpu/bin/nvidia-cuda-mps-control``, installed as the driver's on
booted test hosts) on the same pipe directory.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
from pathlib import Path

CONTROL = "control"  # the control daemon's socket (or FIFO) in its pipe directory
PROBE_TIMEOUT_S = 0.5  # a listening daemon accepts at once; longer means its backlog is full (it is stuck)


def control_path(pipe_directory: Path | str) -> Path:
    return Path(pipe_directory) / CONTROL


def why_not_answering(pipe_directory: Path | str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a control daemon answers at ``pipe_directory``; otherwise why not, in a few words."""
    path = control_path(pipe_directory)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"no control socket at {path}"
    except OSError as exc:
        return f"cannot reach {path}: {exc.strerror}"
    if stat.S_ISSOCK(st.st_mode):
        return _connect(path, timeout)
    if stat.S_ISFIFO(st.st_mode):
        return _open_fifo(path)
    return f"{path} is neither a socket nor a named pipe"


def _connect(path: Path, timeout: float) -> str | None:
    # A blocking connect bounded by SO_SNDTIMEO: a unix socket whose backlog is full (a daemon busy with
    # many clients starting at once) makes the kernel wait for room; a non-blocking one (settimeout)
    # would fail at once with EAGAIN and call a busy daemon down. Still full after ``timeout``: stuck.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        sec = int(timeout)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", sec, int((timeout - sec) * 1e6)))
        try:
            s.connect(str(path))
        except ConnectionRefusedError:
            return f"nothing listens on {path} (its daemon has exited)"
        except (BlockingIOError, TimeoutError):
            return f"{path} accepted no connection within {timeout:g} s (its daemon is stuck)"
        except OSError as exc:
            return f"cannot connect to {path}: {exc.strerror}"
    return None


def _open_fifo(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return f"no process reads {path} (its daemon has exited)"
        return f"cannot open {path}: {exc.strerror}"
    os.close(fd)
    return None
