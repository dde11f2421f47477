"""A host daemon on another machine, over TCP with munge: the broker's ``HostLink`` there.

Each call carries a munge credential this process makes (munged vouches for its uid) whose payload
binds the request (``calque.models.crossing``); the host's daemon decodes it with its own munged and
serves the user ``as_user`` names only when this process is the broker's service user. One request
per connection, like the unix socket.
"""

from __future__ import annotations

import os
import pwd
import socket
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from calque.errors import UnreachableError
from calque.models.crossing import CrossingRequest, binding
from calque.models.session import SessionResponse
from calque.session import munge
from calque.session.broker.hosts import NotSent
from calque.session.broker.local import MAX_ANSWER
from calque.session.broker.local import _error as answer_error


def _me() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError as exc:
        raise NotSent(f"uid {os.getuid()} has no user name here: hosts map users by name") from exc


class RemoteHost:
    """``HostLink`` to the daemon of host ``name`` listening at ``address``:``port``."""

    def __init__(
        self, name: str, address: str, port: int, munge_socket: Path | None = None, timeout: float = 5.0
    ) -> None:
        self.name = name
        self.address = address
        self.port = port
        self.munge_socket = munge_socket
        self.timeout = timeout

    def request(self, op: str, args: dict[str, Any], *, request_id: str, as_user: str | None = None) -> bytes:
        """The request's line, with a fresh credential (each is decoded once: munged's replay cache)."""
        user = _me()
        try:
            cred = munge.encode(binding(op, args, request_id, self.name, as_user, user), socket=self.munge_socket)
        except munge.MungeError as exc:
            raise NotSent(f"host {self.name}: {exc}") from exc
        req = CrossingRequest.model_validate(
            {"op": op, "args": args, "request_id": request_id, "host": self.name, "user": user}
            | ({"as_user": as_user} if as_user is not None else {})
            | {"credential": cred}
        )
        return req.model_dump_json(exclude_none=True).encode() + b"\n"

    def call(self, op: str, args: dict[str, Any], *, request_id: str, as_user: str | None = None) -> Any:
        return self.send(self.request(op, args, request_id=request_id, as_user=as_user))

    def send(self, line: bytes) -> Any:
        where = f"host {self.name} ({self.address}:{self.port})"
        try:
            s = socket.create_connection((self.address, self.port), timeout=self.timeout)
        except OSError as exc:
            raise NotSent(f"cannot connect to {where}: {exc.strerror or exc}") from exc
        buf = bytearray()
        with s:
            try:
                s.sendall(line)
                while b"\n" not in buf and len(buf) <= MAX_ANSWER:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
            except OSError as exc:
                raise UnreachableError(f"{where}: {exc.strerror or exc}") from exc
        if b"\n" not in buf:
            raise UnreachableError(f"{where} closed the connection without answering")
        try:
            resp = SessionResponse.model_validate_json(bytes(buf[: buf.index(b"\n")]))
        except ValidationError as exc:
            raise UnreachableError(f"{where} answered something that is not the session protocol") from exc
        if not resp.ok:
            err = resp.error
            raise answer_error(err.kind if err else "internal", err.message if err else "no error given")
        return resp.result
