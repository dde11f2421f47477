"""The daemon's fair acceptor on a real unix socket: a slow request never holds up accepting or quick requests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from calque.session.daemon.acceptor import Conn, FairAcceptor
from support.waits import HANG_S


class Harness:
    """A FairAcceptor on a socket in ``tmp_path`` whose "slow" requests wait until released (longer than
    any client here waits for an answer)."""

    def __init__(self, path: Path, threads: int) -> None:
        self.release = threading.Event()
        self.served: list[tuple[str, int]] = []  # (request, thread ident)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(64)
        self.path = path
        self.acceptor = FairAcceptor(
            self.listener,
            self.handle,
            threads=threads,
            per_uid=16,
            max_bytes=1024,
            timeout=5.0,
            quick=lambda line: not line.startswith(b"slow"),
        )

    def handle(self, conn: Conn, line: bytes) -> bytes:
        self.served.append((line.decode(), threading.get_ident()))
        if line.startswith(b"slow"):
            self.release.wait(2 * HANG_S)
        return line + b" done\n"

    def send(self, line: bytes) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(HANG_S)
        s.connect(str(self.path))
        s.sendall(line + b"\n")
        return s


def reply(s: socket.socket) -> bytes:
    with s:
        return s.makefile("rb").readline()


@pytest.fixture
def harness(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Harness]:
    d = Harness(tmp_path / "acceptor.sock", threads=getattr(request, "param", 1))
    d.acceptor.start()
    yield d
    d.release.set()
    d.acceptor.stop()
    d.listener.close()


def test_a_quick_request_is_answered_while_a_slow_one_holds_the_only_serving_thread(harness: Harness) -> None:
    slow = harness.send(b"slow-1")
    deadline = time.monotonic() + HANG_S
    while not harness.served:
        assert time.monotonic() < deadline, "the slow request was never taken"
        time.sleep(0.005)
    # Answered while the slow one is still held (it is released only below): not after it.
    assert reply(harness.send(b"quick-1")) == b"quick-1 done\n"
    assert reply(harness.send(b"quick-2")) == b"quick-2 done\n"
    assert [line for line, _ in harness.served] == ["slow-1", "quick-1", "quick-2"]
    harness.release.set()
    assert reply(slow) == b"slow-1 done\n"


@pytest.mark.parametrize("harness", [4], indirect=True)
def test_quick_requests_are_served_by_the_thread_that_read_them(harness: Harness) -> None:
    for i in range(20):
        assert reply(harness.send(f"quick-{i}".encode())) == f"quick-{i} done\n".encode()
    # one thread holds the accept turn throughout, four others stay idle: no hand-off between threads
    assert len({ident for _, ident in harness.served}) == 1
