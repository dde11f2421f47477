"""The session socket as the client sees it: one request per connection, errors as CalqueError.

Standard library only, so that ``calque session status`` and ``list`` (the commands a researcher runs
most) start without importing pydantic: ``SessionSocket.call`` sends one operation and returns the
answer's ``result`` as JSON, after checking who answers (SO_PEERCRED) and reading the envelope by the
contract's rules (``SessionResponse`` in ``calque.models.session``: a strict integer ``version`` this
calque reads, ``ok``, then ``result`` or ``error``, nothing else). ``connection.SessionClient`` adds
each operation's typed arguments and answers on top.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import socket
import struct
import time
from pathlib import Path
from typing import Any

from calque.errors import (
    CalqueError,
    InfrastructureError,
    NothingFreeError,
    RefusedError,
    UnreachableError,
    UsageError,
)
from calque.models.versions import SESSION_PROTOCOL_VERSION, check_version_number
from calque.session.paths import DEFAULT_SOCKET

MAX_RESPONSE_BYTES = 16 * 1024 * 1024
# Ops that are safe to send twice (checkout carries a request id that makes it idempotent).
_RETRY_AFTER_SEND = {"checkout", "status", "list", "report", "ping", "whoami", "metrics"}
_CONNECT_ERRNOS = {errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN}
_ENVELOPE = {"version", "ok", "result", "error"}
UPGRADE_HINT = "upgrade calque on this host so the daemon and its clients speak the same version"
SERVICE_USER_ENV = "CALQUE_SESSION_SERVICE_USER"


class NoFreeSliceError(NothingFreeError):
    """Every matching slice is busy (exit 5); ``--wait`` retries on this."""


def _error_for(kind: str, message: str) -> CalqueError:
    if kind == "busy":
        return NoFreeSliceError(message)
    if kind in ("usage", "not_found"):
        return UsageError(message)
    if kind in ("forbidden", "refused"):
        return RefusedError(message)
    return InfrastructureError(f"session daemon: {message}")


def default_socket() -> Path:
    return Path(os.environ.get("CALQUE_SESSION_SOCKET", str(DEFAULT_SOCKET)))


def trusted_server_uids() -> frozenset[int]:
    """Who may answer at the socket: root, the service user the daemon runs as (when it is not root,
    ``CALQUE_SESSION_SERVICE_USER``), or the caller itself (a daemon of one's own can do nothing a
    process of one's own could not already do)."""
    uids = {0, os.geteuid()}
    name = os.environ.get(SERVICE_USER_ENV, "").strip()
    if name:
        try:
            uids.add(int(name) if name.isdigit() else pwd.getpwnam(name).pw_uid)
        except KeyError as exc:
            raise UsageError(f"{SERVICE_USER_ENV}={name!r} names no user on this host; fix or unset it") from exc
    return frozenset(uids)


def check_peer(sock: socket.socket, path: Path, trusted: frozenset[int]) -> None:
    """Refuse to talk to a process at the socket that is not the session service (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", raw)
    if uid not in trusted:
        raise RefusedError(
            f"the process answering at {path} (pid {pid}) runs as uid {uid}, not root or the session service "
            f"user: refusing to trust it; check the socket path (--socket / CALQUE_SESSION_SOCKET), or set "
            f"{SERVICE_USER_ENV} when the daemon runs as a service user"
        )


def read_answer_line(s: socket.socket, who: str = "the session daemon") -> bytes:
    """One answer line from ``s`` (without its newline), at most ``MAX_RESPONSE_BYTES``."""
    buf = bytearray()
    while b"\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionResetError(errno.ECONNRESET, f"{who} closed the connection without answering")
        buf += chunk
        if len(buf) > MAX_RESPONSE_BYTES:
            raise InfrastructureError(f"{who} sent an oversized response")
    return bytes(buf[: buf.index(b"\n")])


def read_sealed_answer(s: socket.socket, who: str) -> tuple[bytes, bytes | None]:
    """An answer over TCP: its line and the seal line after it (None when the connection ended
    first), each without its newline; ``signed.check_seal`` says whether to believe it."""
    buf = bytearray()
    while buf.count(b"\n") < 2:
        chunk = s.recv(65536)
        if not chunk:
            if b"\n" not in buf:
                raise ConnectionResetError(errno.ECONNRESET, f"{who} closed the connection without answering")
            break
        buf += chunk
        if len(buf) > MAX_RESPONSE_BYTES:
            raise InfrastructureError(f"{who} sent an oversized response")
    lines = bytes(buf).split(b"\n")
    return lines[0], (lines[1] if len(lines) > 2 else None)


def decode_answer(raw: bytes, who: str = "the session daemon") -> Any:
    """The ``result`` of a daemon's answer line, or the CalqueError its ``error`` stands for (which
    keeps its exit code); ``who`` names the daemon in messages (another host's, for ``remote.py``)."""
    unreadable = f"{who} sent a response this client cannot read"
    try:
        resp = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InfrastructureError(f"{unreadable}: {exc}") from exc
    if not isinstance(resp, dict):
        raise InfrastructureError(f"{unreadable}: not a JSON object")
    version = resp.get("version", SESSION_PROTOCOL_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        raise InfrastructureError(f"{unreadable}: version {version!r} is not an integer")
    try:
        check_version_number("protocol", version, SESSION_PROTOCOL_VERSION, UPGRADE_HINT)
    except ValueError as exc:
        raise InfrastructureError(f"{unreadable}: {exc}") from exc
    extra = sorted(set(resp) - _ENVELOPE)
    if extra or not isinstance(resp.get("ok"), bool):
        why = f"unknown field(s) {', '.join(extra)}" if extra else "no ok: true/false"
        raise InfrastructureError(f"{unreadable}: {why}")
    if resp["ok"]:
        return resp.get("result")
    error = resp.get("error")
    if not (
        isinstance(error, dict)
        and set(error) == {"kind", "message"}
        and isinstance(error["kind"], str)
        and isinstance(error["message"], str)
    ):
        raise InfrastructureError(f"{unreadable}: an error without a kind and a message")
    raise _error_for(error["kind"], error["message"])


class SessionSocket:
    """The daemon at ``socket_path``: ``call(op, **args)`` returns the answer's ``result`` (JSON)."""

    def __init__(self, socket_path: Path | None = None, timeout: float = 30.0, retry_for: float = 3.0) -> None:
        self.path = socket_path or default_socket()
        self.timeout = timeout
        self.retry_for = retry_for
        self.trusted = trusted_server_uids()

    def call(self, op: str, **args: Any) -> Any:
        if op == "checkout" and not args.get("request_id"):
            args["request_id"] = os.urandom(16).hex()  # not uuid: it imports platform, slow to start
        request = {"version": SESSION_PROTOCOL_VERSION, "op": op, "args": args}
        line = json.dumps(request, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        start = time.monotonic()
        deadline = start + self.retry_for
        # A full listen backlog (EAGAIN) means the daemon is up but busy: worth waiting for as long
        # as an answer would be, not only as long as for a daemon that is still starting.
        busy_deadline = start + max(self.retry_for, self.timeout)
        delay = 0.05
        while True:
            sent = False
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(self.timeout)
                    s.connect(str(self.path))
                    check_peer(s, self.path, self.trusted)  # before anything is sent or believed
                    s.sendall(line)
                    sent = True
                    raw = read_answer_line(s)
                return decode_answer(raw)
            except OSError as exc:
                retryable = (not sent and exc.errno in _CONNECT_ERRNOS) or (
                    sent and op in _RETRY_AFTER_SEND and not isinstance(exc, socket.timeout)
                )
                busy = not sent and exc.errno == errno.EAGAIN
                if busy:
                    delay = min(delay, 0.01)  # the backlog drains in milliseconds
                if not retryable or time.monotonic() + delay > (busy_deadline if busy else deadline):
                    # never connected: exit 6 (unreachable); a broken exchange after sending stays exit 3
                    error = UnreachableError if not sent else InfrastructureError
                    raise error(
                        f"cannot reach the session daemon at {self.path}: {exc.strerror or exc}; "
                        "is calque-session.service running (or CALQUE_SESSION_SOCKET / --socket right)?"
                    ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
