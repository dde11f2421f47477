"""The MPS control probe against real listeners: the stand-in control daemon, a bare socket, a FIFO.

A file at the control path says nothing (a daemon killed by SIGKILL leaves its socket behind): only a
listener that accepts, or a process holding the FIFO open for reading, counts as answering.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from calque.gpu.mps_probe import why_not_answering
from support.waits import HANG_S

STANDIN = Path(__file__).parent / "bin" / "nvidia-cuda-mps-control"


def _wait(pred: Callable[[], bool], timeout: float = HANG_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_the_stand_in_daemon_answers_until_it_is_killed_and_again_once_restarted(tmp_path: Path) -> None:
    pipe, logs = tmp_path / "pipe", tmp_path / "log"
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    assert why_not_answering(pipe) == f"no control socket at {pipe / 'control'}"

    def start() -> int:
        subprocess.run([sys.executable, str(STANDIN), "-d"], env=env, check=True, capture_output=True, timeout=HANG_S)
        pidfile = pipe / "nvidia-cuda-mps-control.pid"
        assert _wait(lambda: pidfile.exists() and pidfile.read_text().strip().isdigit())
        return int(pidfile.read_text())

    pid = start()
    try:
        assert why_not_answering(pipe) is None
        # Probes faster than the one-threaded daemon accepts fill its backlog: a busy daemon is waited
        # for (within the probe's timeout), never called down.
        assert [why_not_answering(pipe) for _ in range(200)] == [None] * 200
        # The probe sends nothing: the daemon still answers its control program afterwards.
        ctl = subprocess.run(
            [sys.executable, str(STANDIN)], input="get_server_list\n", env=env, capture_output=True, text=True
        )
        assert ctl.returncode == 0, ctl.stderr
        os.kill(pid, signal.SIGKILL)
        assert (pipe / "control").exists()  # the crash left its socket behind
        assert _wait(lambda: why_not_answering(pipe) is not None)
        assert why_not_answering(pipe) == f"nothing listens on {pipe / 'control'} (its daemon has exited)"
        pid = start()  # the stand-in replaces a stale socket, as the real daemon does
        assert why_not_answering(pipe) is None
    finally:
        os.kill(pid, signal.SIGKILL)


def test_a_listening_socket_answers_a_closed_one_does_not(tmp_path: Path) -> None:
    path = tmp_path / "control"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(str(path))
        assert why_not_answering(tmp_path) is not None  # bound, not listening: connect is refused
        srv.listen(1)
        assert why_not_answering(tmp_path) is None
    assert "nothing listens" in (why_not_answering(tmp_path) or "")


def test_a_listener_that_never_accepts_is_stuck_once_its_backlog_is_full(tmp_path: Path) -> None:
    path = tmp_path / "control"
    waiting: list[socket.socket] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(str(path))
        srv.listen(0)
        try:
            for _ in range(64):  # bounded: the kernel's backlog of a listen(0) socket is one or two
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                c.setblocking(False)
                waiting.append(c)
                try:
                    c.connect(str(path))
                except BlockingIOError:
                    break
            else:
                pytest.fail("the backlog never filled")
            started = time.monotonic()
            why = why_not_answering(tmp_path, timeout=0.3)
            assert why == f"{path} accepted no connection within 0.3 s (its daemon is stuck)"
            # Not before its timeout; that it answered at all (nothing ever accepts) is the timeout's doing.
            assert time.monotonic() - started >= 0.25
        finally:
            for c in waiting:
                c.close()


def test_a_fifo_answers_only_while_a_process_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "control"
    os.mkfifo(path)
    assert why_not_answering(tmp_path) == f"no process reads {path} (its daemon has exited)"
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert why_not_answering(tmp_path) is None
    finally:
        os.close(reader)
    assert why_not_answering(tmp_path) is not None


def test_a_regular_file_at_the_control_path_is_not_a_daemon(tmp_path: Path) -> None:
    (tmp_path / "control").write_text("")
    assert why_not_answering(tmp_path) == f"{tmp_path / 'control'} is neither a socket nor a named pipe"


@pytest.mark.skipif(os.geteuid() == 0, reason="root traverses any directory")
def test_a_pipe_directory_the_caller_cannot_enter_is_said_so(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    os.mkfifo(pipe / "control")
    pipe.chmod(0o000)
    try:
        assert "cannot reach" in (why_not_answering(pipe) or "")
    finally:
        pipe.chmod(0o755)
