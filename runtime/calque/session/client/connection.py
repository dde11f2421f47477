"""The client side of the session socket: one request per connection, errors as CalqueError.

Each operation is a method taking its typed arguments and returning its typed answer (the contracts
of ``calque.models.session``); ``call`` sends a raw one (tests, and the retry rules, use it)."""

from __future__ import annotations

import errno
import json
import os
import pwd
import socket
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from calque.errors import (
    CalqueError,
    InfrastructureError,
    NothingFreeError,
    RefusedError,
    UnreachableError,
    UsageError,
    format_validation_error,
)
from calque.models.session import (
    Adopted,
    CheckoutArgs,
    ExtendArgs,
    MetricsText,
    ReleaseArgs,
    ReportArgs,
    RequestArgs,
    Session,
    SessionRefArgs,
    SessionRequest,
    SessionResponse,
    SliceState,
    WhoAmI,
    error_kind,
)
from calque.session.client.paths import DEFAULT_SOCKET

if TYPE_CHECKING:
    from calque.models.session import UsageReport

MAX_RESPONSE_BYTES = 16 * 1024 * 1024
# Ops that are safe to send twice (checkout carries a request id that makes it idempotent).
_RETRY_AFTER_SEND = {"checkout", "status", "list", "report", "ping", "whoami", "metrics"}
_CONNECT_ERRNOS = {errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN}


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


A = TypeVar("A", bound=RequestArgs)


def typed(model: type[A], **args: Any) -> A:
    """``model``'s arguments, checked here by the rules the daemon checks again: a broken rule is a
    UsageError (exit 2), or a RefusedError (exit 4) for a rule that refuses (MPS without consent)."""
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        why = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise (RefusedError if error_kind(exc) == "refused" else UsageError)(why) from exc


def default_socket() -> Path:
    return Path(os.environ.get("CALQUE_SESSION_SOCKET", str(DEFAULT_SOCKET)))


SERVICE_USER_ENV = "CALQUE_SESSION_SERVICE_USER"


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


class SessionClient:
    def __init__(self, socket_path: Path | None = None, timeout: float = 30.0, retry_for: float = 3.0) -> None:
        self.path = socket_path or default_socket()
        self.timeout = timeout
        self.retry_for = retry_for
        self.trusted = trusted_server_uids()

    # -- each operation, typed ----------------------------------------------------------------------

    def checkout(self, args: CheckoutArgs) -> Session:
        return Session.model_validate(self.call("checkout", **args.model_dump()))

    def checkin(self, session_id: str | None = None) -> Session:
        return Session.model_validate(self.call("checkin", **typed(SessionRefArgs, id=session_id).model_dump()))

    def extend(self, session_id: str | None, by: str | float) -> Session:
        return Session.model_validate(self.call("extend", **typed(ExtendArgs, id=session_id, by=by).model_dump()))

    def status(self) -> list[Session]:
        """The caller's live sessions."""
        return [Session.model_validate(s) for s in self.call("status")]

    def list_slices(self) -> list[SliceState]:
        """Every slice on the host, busy or free; holders and session ids for root and admins (and the
        caller's own): as root, every live session on the host."""
        return [SliceState.model_validate(s) for s in self.call("list")]

    def release(self, session_id: str, reason: str | None = None) -> Session:
        """End anyone's session now (root or the admin group only); ``reason`` goes to the audit trail."""
        args = typed(ReleaseArgs, id=session_id, force=True, reason=reason)
        return Session.model_validate(self.call("release", **args.model_dump()))

    def report(self, since: str | float = "7d") -> UsageReport:
        from calque.models.session import UsageReport

        return UsageReport.model_validate(self.call("report", **typed(ReportArgs, since=since).model_dump()))

    def adopt(self, session_id: str | None = None) -> Adopted:
        """Move this very process into the session's cgroup (``calque session run`` then execs)."""
        return Adopted.model_validate(self.call("adopt", **typed(SessionRefArgs, id=session_id).model_dump()))

    def whoami(self) -> WhoAmI:
        return WhoAmI.model_validate(self.call("whoami"))

    def metrics(self) -> str:
        """The Prometheus text (live sessions per user only in an admin's answer)."""
        return MetricsText.model_validate(self.call("metrics")).text

    # -- the wire -------------------------------------------------------------------------------------

    def call(self, op: str, **args: Any) -> Any:
        if op == "checkout" and not args.get("request_id"):
            args["request_id"] = os.urandom(16).hex()  # not uuid: it imports platform, slow to start
        line = SessionRequest(op=op, args=args).model_dump_json().encode() + b"\n"
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
                    raw = self._read(s)
                return self._decode(raw)
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

    def _read(self, s: socket.socket) -> bytes:
        buf = bytearray()
        while b"\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionResetError(errno.ECONNRESET, "the daemon closed the connection without answering")
            buf += chunk
            if len(buf) > MAX_RESPONSE_BYTES:
                raise InfrastructureError("the session daemon sent an oversized response")
        return bytes(buf[: buf.index(b"\n")])

    def _decode(self, raw: bytes) -> Any:
        return decode_response(raw)


def decode_response(raw: bytes, who: str = "the session daemon") -> Any:
    """The result in a daemon's answer line, or its error as the CalqueError that keeps its exit code."""
    try:
        resp = SessionResponse.model_validate_json(raw)
    except ValidationError as exc:
        raise InfrastructureError(
            format_validation_error(exc, f"{who} sent a response this client cannot read")
        ) from exc
    except json.JSONDecodeError as exc:
        raise InfrastructureError(f"{who} sent a response this client cannot read: {exc}") from exc
    if not resp.ok:
        assert resp.error is not None
        raise _error_for(resp.error.kind, resp.error.message)
    return resp.result
