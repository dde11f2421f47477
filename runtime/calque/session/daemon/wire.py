"""The wire format: one JSON object per line each way, one request per connection.

Requests are bounded in size and in time; anything else gets an error response (when the peer is
still there) and the connection is closed. Nothing a client sends can stop the daemon.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

from pydantic import ValidationError

from calque.errors import format_validation_error
from calque.models.session import (
    ErrorKind,
    SessionErrorBody,
    SessionRequest,
    SessionResponse,
)


class RequestError(Exception):
    """A request that cannot be served; ``kind`` goes back to the client."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel knows it."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def read_line(sock: socket.socket, max_bytes: int, timeout: float) -> bytes:
    """Read up to a newline within ``timeout`` seconds in total; raise RequestError otherwise."""
    deadline = time.monotonic() + timeout
    buf = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RequestError("protocol", f"request not complete within {timeout:g} s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(min(65536, max_bytes + 1 - len(buf)))
        except TimeoutError as exc:
            raise RequestError("protocol", f"request not complete within {timeout:g} s") from exc
        if not chunk:
            raise RequestError("protocol", "connection closed before a complete request (no newline)")
        buf += chunk
        nl = buf.find(b"\n")
        if nl >= 0:
            if nl > max_bytes:
                raise RequestError("protocol", f"request larger than {max_bytes} bytes")
            return bytes(buf[:nl])
        if len(buf) > max_bytes:
            raise RequestError("protocol", f"request larger than {max_bytes} bytes")


# Operations that may wait on more than the registry: systemd (adopt, notebook), a long read (report, metrics).
SLOW_OPS = frozenset({"adopt", "notebook", "report", "metrics", "ledger"})


_SLOW_NAMES = tuple(op.encode() for op in sorted(SLOW_OPS))


def quick_request(line: bytes) -> bool:
    """Whether serving ``line`` waits on nothing but the registry, so the acceptor's turn holder may serve it
    itself; anything unparsable is quick too (its answer is an error)."""
    if b"\\" not in line and not any(name in line for name in _SLOW_NAMES):
        return True  # no slow op's name anywhere, nor an escape that could spell one: no need to parse
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        return True
    op = doc.get("op") if isinstance(doc, dict) else None
    return not (isinstance(op, str) and op in SLOW_OPS)


def parse_request(line: bytes) -> SessionRequest:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError("protocol", "request is not UTF-8") from exc
    try:
        # the model refuses a newer protocol version before any field (see calque.models.base)
        return SessionRequest.model_validate_json(text)
    except ValidationError as exc:
        raise RequestError("protocol", format_validation_error(exc, "bad request")) from exc


def ok(result: Any) -> bytes:
    return SessionResponse(ok=True, result=result).model_dump_json().encode() + b"\n"


def error(kind: ErrorKind, message: str) -> bytes:
    body = SessionErrorBody(kind=kind, message=message)
    return SessionResponse(ok=False, error=body).model_dump_json().encode() + b"\n"
