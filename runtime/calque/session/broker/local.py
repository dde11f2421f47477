"""A host daemon on the broker's own machine, through its unix socket: the local path.

The daemon knows its caller by SO_PEERCRED, so a call made for a user is made by a process that is
that user: a child forked for the one exchange drops to the user's uid, gid and groups before it
connects, and the daemon sees exactly what it would see of the user's own client. Only a broker
running as root can do that; any other broker calls as itself. Hosts elsewhere are reached over TCP
with munge (``calque.session.remote``).

The child runs no Python code that could take a lock another thread held at the fork (no import, no
logging): setgroups/setgid/setuid, connect, send, read, write the answer to a pipe, ``_exit``.
"""

from __future__ import annotations

import json
import os
import pwd
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


NOT_SENT_EXIT = 3  # the child's exit code when it could not connect


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
        line = SessionRequest(op=op, args=args).model_dump_json().encode() + b"\n"
        try:
            raw = self._as(as_user, line) if as_user is not None else _exchange(self.path, line, self.timeout)
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

    def _as(self, user: str, line: bytes) -> bytes:
        if os.geteuid() != 0:
            raise RefusedError(f"the broker does not run as root: it cannot ask host {self.name} for {user}")
        try:
            pw = pwd.getpwnam(user)
        except KeyError as exc:
            raise RefusedError(f"user {user} has no account on host {self.name}") from exc
        groups = os.getgrouplist(user, pw.pw_gid)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the user, for one exchange
            code = 0
            try:
                os.close(r)
                os.setgroups(groups)
                os.setgid(pw.pw_gid)
                os.setuid(pw.pw_uid)
                answer = _exchange(self.path, line, self.timeout)
                view = memoryview(answer)
                while view:
                    view = view[os.write(w, view) :]
            except NotSent:
                code = NOT_SENT_EXIT
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        try:
            chunks = []
            while chunk := os.read(r, 65536):
                chunks.append(chunk)
        finally:
            os.close(r)
            _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code == NOT_SENT_EXIT:
            raise NotSent(f"cannot connect to {self.path} as {user}")
        if code != 0:
            raise OSError(f"the call as {user} failed (could not reach {self.path} as that user)")
        return b"".join(chunks)
