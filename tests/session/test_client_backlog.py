"""The client against a daemon whose listen backlog is full: it waits its turn, it does not give up."""

from __future__ import annotations

import errno
import json
import socket
import threading
import time
from pathlib import Path

import pytest
from calque.errors import UnreachableError
from calque.session.client.connection import SessionClient
from support.waits import HANG_S


def _fill_backlog(path: Path) -> tuple[socket.socket, list[socket.socket]]:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(0)
    queued: list[socket.socket] = []
    for _ in range(64):  # a listen(0) backlog holds one or two; stop at the first refusal
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.setblocking(False)
        if c.connect_ex(str(path)) == errno.EAGAIN:
            c.close()
            return server, queued
        queued.append(c)
    raise AssertionError("the backlog never filled: EAGAIN is not what this kernel answers")


def _serve_after(server: socket.socket, queued: list[socket.socket], delay: float) -> None:
    time.sleep(delay)
    for c in queued:
        c.close()
    for _ in range(len(queued) + 1):  # the flood's (now closed) connections, then the client's
        conn, _ = server.accept()
        with conn:
            line = conn.makefile("rb").readline()
            if line:
                conn.sendall(json.dumps({"ok": True, "result": {"pong": True}}).encode() + b"\n")
                return


def test_a_full_backlog_is_waited_out_not_reported_unreachable(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    server, queued = _fill_backlog(path)
    t = threading.Thread(target=_serve_after, args=(server, queued, 0.3), daemon=True)
    t.start()
    started = time.monotonic()
    # The client waits on a full backlog as long as for an answer (its timeout): a hang's, so that only
    # the backlog draining (0.3 s on) can end its wait, however late this machine's thread gets there.
    answer = SessionClient(path, timeout=HANG_S, retry_for=0).call("ping")
    assert answer == {"pong": True}
    assert time.monotonic() - started >= 0.25  # it waited for the backlog to drain
    t.join(HANG_S)
    server.close()


def test_a_backlog_that_never_drains_ends_at_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    server, queued = _fill_backlog(path)
    started = time.monotonic()
    with pytest.raises(UnreachableError, match="cannot reach the session daemon"):
        SessionClient(path, timeout=0.5, retry_for=0).call("ping")
    # Not before its timeout; that it returned at all (nothing ever drains the backlog) is the timeout's doing.
    assert time.monotonic() - started >= 0.4
    for c in queued:
        c.close()
    server.close()
