"""A host daemon on the broker's own machine, through its unix socket: the local path.

Every request is marked as the broker's (``SessionRequest.broker``) and names the user it acts for
(``as_user``); the daemon honours both only from the broker's service user (SO_PEERCRED: root unless
``institution.yaml`` names another), and takes them as its word that the broker answers, so a
checkout keeps the queue's order (``session/daemon/door.py``). Hosts elsewhere are reached over TCP
with munge (``calque.session.remote``).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from calque.errors import CalqueError, InfrastructureError, NothingFreeError, RefusedError, UsageError
from calque.models.session import SessionRequest
from calque.session.remote import NotSent

MAX_ANSWER = 16 * 1024 * 1024


def _error(kind: str, message: str) -> CalqueError:
    if kind == "busy":
        return NothingFreeError(message)
    if kind in ("usage", "not_found"):
        return UsageError(message)
    if kind in ("forbidden", "refused"):
        return RefusedError(message)
    return InfrastructureError(f"host daemon: {message}")


def _exchange(path: str, line: bytes, timeout: float) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(path)
        except OSError as exc:
            raise NotSent(f"cannot connect to {path}: {exc.strerror or exc}") from exc
        s.sendall(line)
        buf = bytearray()
        while b"\n" not in buf and len(buf) <= MAX_ANSWER:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return bytes(buf)


class LocalHost:
    """``HostLink`` over a daemon's unix socket on this machine."""

    def __init__(self, name: str, socket_path: Path, timeout: float = 5.0) -> None:
        self.name = name
        self.path = str(socket_path)
        self.timeout = timeout

    def call(self, op: str, args: dict[str, Any], *, request_id: str, as_user: str | None = None) -> Any:
        line = SessionRequest(op=op, args=args, broker=True, as_user=as_user).model_dump_json().encode() + b"\n"
        try:
            raw = _exchange(self.path, line, self.timeout)
        except NotSent as exc:
            raise NotSent(f"host {self.name}: {exc}") from exc
        except OSError as exc:  # sent, and then no answer: the host may have done it
            raise InfrastructureError(f"host {self.name} ({self.path}) did not answer: {exc.strerror or exc}") from exc
        if b"\n" not in raw:
            raise InfrastructureError(f"host {self.name} closed the connection without answering")
        doc = json.loads(raw[: raw.index(b"\n")])
        if not doc.get("ok"):
            err = doc.get("error") or {}
            raise _error(str(err.get("kind")), str(err.get("message")))
        return doc.get("result")
