"""The researcher's side of the broker's socket: ``checkout --anywhere``, ``queue``, ``list --all``.

One request per connection, as with a host's daemon, and the same check of who answers (SO_PEERCRED:
root or the service user) before anything is sent or believed. A waiting checkout keeps its
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
from pathlib import Path
from typing import Any

from calque.errors import InfrastructureError, UnreachableError
from calque.models.broker import AnywhereArgs, BrokerRequest, Grant, HostView, QueueEntry
from calque.session.client.wire import check_peer, decode_answer, read_answer_line, trusted_server_uids

DEFAULT_BROKER_SOCKET = Path("/run/calque/broker.sock")
BROKER_SOCKET_ENV = "CALQUE_BROKER_SOCKET"
RECONNECT_FOR_S = 120.0  # how long a waiting client looks for a broker that went away


def default_broker_socket() -> Path:
    return Path(os.environ.get(BROKER_SOCKET_ENV, str(DEFAULT_BROKER_SOCKET)))


class Dropped(Exception):
    """The broker's connection broke after the request was sent (a restart, a network drop)."""


class BrokerClient:
    def __init__(
        self, socket_path: Path | None = None, timeout: float = 30.0, reconnect_for: float = RECONNECT_FOR_S
    ) -> None:
        self.path = socket_path or default_broker_socket()
        self.timeout = timeout
        self.reconnect_for = reconnect_for
        self.trusted = trusted_server_uids()

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
                        f"lost the broker at {self.path} for {self.reconnect_for:g} s: {exc}"
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

    def call(self, op: str, args: dict[str, Any], wait: bool = False) -> Any:
        """One request; ``wait`` reads the answer for as long as the broker keeps the connection (a
        queued checkout). UnreachableError before sending, Dropped after."""
        line = BrokerRequest(op=op, args=args).model_dump_json().encode() + b"\n"
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
                raise Dropped(str(exc.strerror or exc)) from exc
            hint = "" if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED) else "; is calque-broker.service running?"
            raise UnreachableError(f"cannot reach the broker at {self.path}: {exc.strerror or exc}{hint}") from exc
        return self._decode(raw)

    @staticmethod
    def _decode(raw: bytes) -> Any:
        return decode_answer(raw, "the broker")
