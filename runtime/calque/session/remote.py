"""The client of another host's session daemon, over TCP: one request per connection, each carrying a
munge credential this very process makes (so munge vouches for its uid), bound to the request.

``RemoteHost(name, address, port).call(op, args, request_id=...)`` answers what the local client's
call answers, and raises the same errors (a refusal stays exit 4, a busy host exit 5, no answer exit 6).
The broker passes ``as_user`` to act for a user; the host daemon accepts that from the broker's service
uid only. Used by the CLI and the broker; it never imports the daemon.
"""

from __future__ import annotations

import errno
import os
import pwd
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calque.errors import InfrastructureError, UnreachableError
from calque.models.institution import RemoteRequest, binding
from calque.session import munge
from calque.session.signed import check_seal
from calque.session.wire import decode_answer, read_sealed_answer


class NotSent(UnreachableError):
    """The host could not be reached at all: the request never left, so nothing was made there."""


# Ops safe to send twice: checkout's request id makes it idempotent, the rest change nothing.
_RETRY_AFTER_SEND = {"checkout", "status", "list", "report", "ping", "whoami", "metrics"}


def new_request_id() -> str:
    return os.urandom(16).hex()


def own_user_name() -> str:
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError as exc:
        raise InfrastructureError(
            f"uid {uid} has no user name on this host: requests to other hosts name users"
        ) from exc


@dataclass
class RemoteHost:
    name: str  # the host's name as the institution file gives it (the credential is bound to it)
    address: str
    port: int
    munge_socket: Path | None = None
    timeout: float = 30.0
    retry_for: float = 3.0
    service_user: str = "root"  # whose seal its daemon's answers carry (institution.yaml's host entry)

    def envelope(
        self, op: str, args: dict[str, Any], *, request_id: str, as_user: str | None = None, user: str | None = None
    ) -> RemoteRequest:
        """The request as it goes on the wire, with a fresh credential bound to it."""
        user = user or own_user_name()
        payload = binding(op, args, request_id, self.name, user, as_user)
        cred = munge.encode(payload, socket=self.munge_socket)
        return RemoteRequest.model_validate(
            {
                "op": op,
                "args": args,
                "request_id": request_id,
                "host": self.name,
                "user": user,
                "as_user": as_user,
                "credential": cred,
            }
        )

    def call(self, op: str, args: dict[str, Any] | None = None, *, request_id: str, as_user: str | None = None) -> Any:
        """Send one request; its result, or the error the daemon answered as a CalqueError. A retry
        after a lost answer sends a new credential (a credential decodes once) with the same request id."""
        args = dict(args or {})
        if op == "checkout":
            args.setdefault("request_id", request_id)  # the host's idempotence key for the grant
        start = time.monotonic()
        delay = 0.05
        while True:
            line = self.envelope(op, args, request_id=request_id, as_user=as_user).model_dump_json().encode() + b"\n"
            sent = False
            who = f"the session daemon on {self.name}"
            try:
                with socket.create_connection((self.address, self.port), timeout=self.timeout) as s:
                    s.sendall(line)
                    sent = True
                    answer, sealed = read_sealed_answer(s, who)
            except OSError as exc:
                retryable = (not sent and exc.errno in (errno.ECONNREFUSED, errno.EAGAIN)) or (
                    sent and op in _RETRY_AFTER_SEND and not isinstance(exc, socket.timeout)
                )
                if not retryable or time.monotonic() + delay > start + self.retry_for:
                    where = f"{self.name} ({self.address}:{self.port})"
                    if not sent:
                        raise NotSent(  # an UnreachableError (exit 6) the broker can tell: nothing reached the host
                            f"cannot reach the session daemon on {where}: {exc.strerror or exc}; "
                            "is calque-session.service running there with listen_tcp set?"
                        ) from exc
                    raise InfrastructureError(f"the session daemon on {where} did not answer: {exc}") from exc
            else:
                check_seal(
                    request_id, answer, sealed, munge_socket=self.munge_socket, signer=self.service_user, who=who
                )
                return decode_answer(answer, who)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
