"""The researcher's side of the broker: ``checkout --anywhere``, ``queue``, ``list --all``.

On the front-door host, its unix socket, with the same check of who answers as a host's daemon
(SO_PEERCRED: root or the service user) before anything is sent or believed. Anywhere else, its TCP
port as ``institution.yaml`` names it (``BrokerClient.here``): each request carries a munge
credential this very process makes, bound to the request and to the broker's name, so the broker
learns the caller's uid from munge as it would from the kernel. One request per connection. A waiting checkout keeps its
connection open until the grant comes; when the connection drops (the broker restarted) the client
connects again and sends the same request, whose id finds it in the queue where it was, for as long
as ``reconnect_for`` (the broker holds a grant for a claim window meanwhile).
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calque.errors import InfrastructureError, UnreachableError
from calque.models.broker import (
    AnywhereArgs,
    BrokerRequest,
    Grant,
    HostView,
    LabStanding,
    QueueEntry,
    RemoteBrokerRequest,
)
from calque.models.institution import binding
from calque.session import munge
from calque.session.institution import DEFAULT_INSTITUTION
from calque.session.remote import own_user_name
from calque.session.signed import check_seal
from calque.session.wire import (
    check_peer,
    decode_answer,
    read_answer_line,
    read_sealed_answer,
    trusted_server_uids,
)

DEFAULT_BROKER_SOCKET = Path("/run/calque/broker.sock")
BROKER_SOCKET_ENV = "CALQUE_BROKER_SOCKET"
INSTITUTION_ENV = "CALQUE_INSTITUTION"
MUNGE_SOCKET_ENV = "CALQUE_MUNGE_SOCKET"
RECONNECT_FOR_S = 120.0  # how long a waiting client looks for a broker that went away


def default_broker_socket() -> Path:
    return Path(os.environ.get(BROKER_SOCKET_ENV, str(DEFAULT_BROKER_SOCKET)))


class Dropped(InfrastructureError):
    """The broker's connection broke after the request was sent (a restart, a network drop): a waiting
    checkout connects again; any other request ends with this sentence (exit 3), never a traceback."""


@dataclass(frozen=True)
class BrokerAddress:
    """The broker over TCP: its name (what a credential is bound to), address and port."""

    name: str
    address: str
    port: int
    service_user: str = "root"  # whose seal an answer must carry
    munge_socket: Path | None = None

    def __str__(self) -> str:
        return f"{self.name} ({self.address}:{self.port})"


class BrokerClient:
    def __init__(
        self,
        socket_path: Path | None = None,
        timeout: float = 30.0,
        reconnect_for: float = RECONNECT_FOR_S,
        remote: BrokerAddress | None = None,
        as_user: str | None = None,
    ) -> None:
        self.path = socket_path or default_broker_socket()
        self.as_user = as_user  # the institution's hub asking for a user (the broker refuses anyone else)
        self.timeout = timeout
        self.reconnect_for = reconnect_for
        self.trusted = trusted_server_uids()
        self.remote = remote

    @classmethod
    def here(cls, socket_path: Path | None = None, institution: Path | None = None) -> BrokerClient:
        """The broker's unix socket when it is on this host, else its TCP port from ``institution.yaml``
        (``CALQUE_INSTITUTION``, default /etc/calque/institution.yaml; munged's socket from
        ``CALQUE_MUNGE_SOCKET`` when not munge's own)."""
        path = socket_path or default_broker_socket()
        if path.is_socket():
            return cls(path)
        from calque.session.institution import load_institution

        inst_path = institution or Path(os.environ.get(INSTITUTION_ENV, str(DEFAULT_INSTITUTION)))
        broker = load_institution(inst_path).broker if inst_path.exists() else None
        if broker is None:
            return cls(path)  # its error names the socket that is not there
        munge_socket = os.environ.get(MUNGE_SOCKET_ENV)
        remote = BrokerAddress(
            broker.name, broker.address, broker.port, broker.service_user, Path(munge_socket) if munge_socket else None
        )
        return cls(path, remote=remote)

    @property
    def where(self) -> str:
        return str(self.remote) if self.remote is not None else str(self.path)

    def anywhere(self, args: AnywhereArgs, progress: Callable[[str], None] = lambda m: None) -> Grant:
        if not args.request_id:
            args = args.model_copy(update={"request_id": "r-" + os.urandom(12).hex()})
        payload = args.model_dump(mode="json")
        if not args.wait:
            return Grant.model_validate(self.call("anywhere", payload))
        gone_since: float | None = None
        told = False
        for _ in range(100_000):  # bounded: each turn waits for a grant or a reconnect back-off
            try:
                result = self.call("anywhere", payload, wait=True)
            except (Dropped, UnreachableError) as exc:
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > self.reconnect_for:
                    raise UnreachableError(
                        f"lost the broker at {self.where} for {self.reconnect_for:g} s: {exc}"
                    ) from exc
                if not told:
                    progress(f"the broker's connection dropped ({exc}); reconnecting (request {args.request_id})")
                    told = True
                time.sleep(0.2)
                continue
            gone_since, told = None, False
            if result is not None:
                return Grant.model_validate(result)
            # None: the broker let the connection go while stopping; the request waits there still
        raise InfrastructureError(f"gave up waiting for the broker (request {args.request_id})")

    def queue(self, all_users: bool = False) -> list[QueueEntry]:
        return [QueueEntry.model_validate(e) for e in self.call("queue", {"all": all_users})]

    def cancel(self, request_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call("cancel", {"id": request_id})
        return result

    def on_host(self, ref: str, op: str, by: str | None = None) -> Any:
        """``checkin``/``extend``/``status`` of one's own session ``SESSION@HOST`` on its host."""
        args: dict[str, Any] = {"ref": ref, "op": op}
        if by is not None:
            args["by"] = by
        return self.call("on_host", args)

    def hosts(self) -> list[HostView]:
        return [HostView.model_validate(h) for h in self.call("hosts", {})]

    def lab(self) -> LabStanding:
        """The caller's lab and its budget left this month, as the broker's last budget round summed it."""
        return LabStanding.model_validate(self.call("lab", {}))

    def call(self, op: str, args: dict[str, Any], wait: bool = False) -> Any:
        """One request; ``wait`` reads the answer for as long as the broker keeps the connection (a
        queued checkout). UnreachableError before sending, Dropped after."""
        if self.remote is not None:
            return self._decode(self._call_tcp(self.remote, op, args, wait))
        line = BrokerRequest(op=op, args=args, as_user=self.as_user).model_dump_json().encode() + b"\n"
        sent = False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout)
                s.connect(str(self.path))
                check_peer(s, self.path, self.trusted)
                s.sendall(line)
                sent = True
                s.settimeout(None if wait else self.timeout)
                raw = read_answer_line(s, "the broker")
        except OSError as exc:
            if sent:
                raise Dropped(
                    f"the broker at {self.path} dropped the connection before answering: {exc.strerror or exc}"
                ) from exc
            hint = "" if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED) else "; is calque-broker.service running?"
            raise UnreachableError(f"cannot reach the broker at {self.path}: {exc.strerror or exc}{hint}") from exc
        return self._decode(raw)

    def _call_tcp(self, to: BrokerAddress, op: str, args: dict[str, Any], wait: bool) -> bytes:
        request_id = os.urandom(16).hex()
        user = own_user_name()
        cred = munge.encode(binding(op, args, request_id, to.name, user, self.as_user), socket=to.munge_socket)
        envelope = RemoteBrokerRequest.model_validate(
            {
                "op": op,
                "args": args,
                "request_id": request_id,
                "host": to.name,
                "user": user,
                "as_user": self.as_user,
                "credential": cred,
            }
        )
        sent = False
        try:
            with socket.create_connection((to.address, to.port), timeout=self.timeout) as s:
                s.sendall(envelope.model_dump_json().encode() + b"\n")
                sent = True
                s.settimeout(None if wait else self.timeout)
                answer, sealed = read_sealed_answer(s, f"the broker at {to}")
        except OSError as exc:
            if sent:
                raise Dropped(
                    f"the broker at {to} dropped the connection before answering: {exc.strerror or exc}"
                ) from exc
            raise UnreachableError(
                f"cannot reach the broker at {to}: {exc.strerror or exc}; is calque-broker.service running there "
                "with tcp_addr set?"
            ) from exc
        check_seal(
            request_id, answer, sealed, munge_socket=to.munge_socket, signer=to.service_user, who=f"the broker at {to}"
        )
        return answer

    @staticmethod
    def _decode(raw: bytes) -> Any:
        return decode_answer(raw, "the broker")
