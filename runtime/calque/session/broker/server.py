"""The broker's sockets: a unix socket on its own host (SO_PEERCRED names the caller), TCP for
researchers on other hosts (each request carries a munge credential: ``tcp.py``), and a UDP port (the
same number) for the host daemons' nudges (``nudges.py``: signed, rate-limited per host).

Every accepted connection is read by the intake (``intake.py``: one thread, one deadline per whole
request, a small budget for unread connections no single source can exhaust). Only a whole request
is identified, and only then counted against its user: ``max_connections_per_uid`` connections per
authenticated uid (a waiting client holds one for as long as it waits), ``max_connections`` in all.
One beyond is answered with a sentence, never dropped.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from calque.errors import CalqueError, RefusedError, format_validation_error
from calque.models.broker import (
    BROKER_REQUESTS,
    AnywhereArgs,
    BrokerRequest,
    CancelArgs,
    NudgeArgs,
    OnHostArgs,
    QueueArgs,
)
from calque.models.session import LedgerArgs, SessionErrorBody, SessionResponse, error_kind
from calque.session.broker.broker_config import BrokerConfig
from calque.session.broker.callers import Caller, caller
from calque.session.broker.hub import acting_for
from calque.session.broker.intake import Intake, Unread
from calque.session.broker.nudges import NUDGE_MAX_BYTES, NudgeGate
from calque.session.broker.service import BrokerService
from calque.session.files import prepare_socket

log = logging.getLogger("calque.broker")

STOP_GRACE_S = 5.0  # how long stop() lets connections being served end before the store closes


def _kind_of(exc: CalqueError) -> str:
    return {2: "usage", 4: "refused", 5: "busy"}.get(exc.exit_code, "internal")


def answer(ok: bool, result: object = None, kind: str = "internal", message: str = "") -> bytes:
    body = None if ok else SessionErrorBody.model_validate({"kind": kind, "message": message})
    return SessionResponse(ok=ok, result=result, error=body).model_dump_json().encode() + b"\n"


def closed(sock: socket.socket) -> bool:
    """Whether the peer has gone (readable with nothing to read), without consuming what it sent."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
        return bool(r) and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


Identify = Callable[[bytes], tuple[int, int, bytes]]
Seal = Callable[[bytes], bytes]  # an answer line -> the line after it that proves who answered (TCP)


def _peer(uid: int, gid: int) -> Identify:
    """A unix-socket caller: who SO_PEERCRED said, whatever the request says."""
    return lambda line: (uid, gid, line)


class BrokerServer:
    def __init__(
        self,
        config: BrokerConfig,
        service: BrokerService,
        labs: Mapping[str, frozenset[str]],
        hub_user: str | None = None,
    ) -> None:
        self.config = config
        self.service = service
        self.labs = dict(labs)
        self.hub_user = hub_user  # institution.yaml's hub: may name another user (``hub.py``)
        self.audit: Callable[..., Any] | None = None  # the broker's audit log, once it is open
        self.stopping = threading.Event()
        self._open: collections.Counter[int] = collections.Counter()  # connections being served, per uid
        self._total = 0
        self._lock = threading.Condition()  # notified as each connection ends: stop() waits on it
        self._threads: list[threading.Thread] = []
        self.unix: socket.socket | None = None
        self.udp: socket.socket | None = None
        self.tcp: socket.socket | None = None
        self.nudges: NudgeGate | None = None  # set by the process with the UDP port (``bind_nudges``)
        self.intake = Intake(
            deadline_s=config.request_timeout,
            max_bytes=config.max_request_bytes,
            max_unread=config.max_unread,
            max_unread_per_source=config.max_unread_per_source,
            refusal=lambda sentence: answer(False, kind="refused", message=sentence),
            on_line=self._line,
        )

    # -- listening ----------------------------------------------------------------------------------

    def bind_unix(self, path: Path) -> None:
        prepare_socket(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        os.chmod(path, 0o666)  # anyone may ask; SO_PEERCRED says who is asking
        sock.listen(512)
        self.unix = sock
        self.intake.start()
        self._spawn(self._accept_unix, "broker-unix")

    def bind_tcp(self, addr: str, port: int, identify: Callable[[str], tuple[Identify, Seal]]) -> None:
        """Researchers on other hosts; ``identify(peer)`` checks each request's munge credential."""
        sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(512)
        self.tcp = sock
        self._spawn(lambda: self._accept_tcp(identify), "broker-tcp")

    def bind_nudges(self, addr: str, port: int, gate: NudgeGate) -> None:
        """The UDP port host daemons nudge (a nudge only makes the broker list that host), each one
        checked by ``gate`` (its sender's credential, its host's rate)."""
        self.nudges = gate
        sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((addr, port))
        sock.settimeout(0.5)
        self.udp = sock
        self._spawn(self._nudges, "broker-nudges")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self.stopping.set()
        for s in (self.unix, self.udp, self.tcp):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
        self.intake.stop()
        # Connections still being served read the store the broker closes next: let them see
        # ``stopping`` (a waiting one looks every WAIT_TICK_S) and end first, within a bound.
        deadline = time.monotonic() + STOP_GRACE_S
        with self._lock:
            while self._total > 0 and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(left)
            if self._total > 0:
                log.warning("%d broker connection(s) open after %.0f s; stopping anyway", self._total, STOP_GRACE_S)

    def _accept_unix(self) -> None:
        assert self.unix is not None
        while not self.stopping.is_set():
            try:
                conn, _ = self.unix.accept()
            except OSError:
                if self.stopping.is_set():
                    return
                continue
            try:
                raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                _, uid, gid = struct.unpack("3i", raw)
            except OSError:
                conn.close()
                continue
            self.intake.add(conn, f"uid {uid}", (_peer(uid, gid), None))

    def _accept_tcp(self, identify: Callable[[str], tuple[Identify, Seal]]) -> None:
        assert self.tcp is not None
        while not self.stopping.is_set():
            try:
                conn, addr = self.tcp.accept()
            except OSError:
                if self.stopping.is_set():
                    return
                continue
            ident, seal = identify(f"{addr[0]}:{addr[1]}")
            self.intake.add(conn, str(addr[0]), (ident, seal))

    def _nudges(self) -> None:
        assert self.udp is not None and self.nudges is not None
        while not self.stopping.is_set():
            try:
                data, addr = self.udp.recvfrom(NUDGE_MAX_BYTES)
            except TimeoutError:
                continue
            except OSError:
                if self.stopping.is_set():
                    return
                continue
            name = self.nudges.check(data, str(addr[0]))
            if name is not None:
                self.service.dispatcher.nudge(name)

    # -- one connection -----------------------------------------------------------------------------

    def _line(self, unread: Unread, line: bytes) -> None:
        """A whole request line (the intake's thread): served on a thread of its own."""
        identify, seal = unread.context
        threading.Thread(target=self._serve, args=(unread.conn, line, identify, seal), daemon=True).start()

    def _enter(self, uid: int) -> str | None:
        """Count a connection against ``uid``; the sentence refusing it when over a bound."""
        with self._lock:
            if self._open[uid] >= self.config.max_connections_per_uid:
                return (
                    f"you hold {self._open[uid]} connections to the broker already (at most "
                    f"{self.config.max_connections_per_uid} per user; each waiting checkout holds one): "
                    "end one, or retry later"
                )
            if self._total >= self.config.max_connections:
                return f"the broker is serving {self._total} connections, its most; retry later"
            self._open[uid] += 1
            self._total += 1
            return None

    def _leave(self, uid: int) -> None:
        with self._lock:
            self._open[uid] -= 1
            self._total -= 1
            if self._open[uid] <= 0:
                del self._open[uid]
            self._lock.notify_all()

    def _serve(self, conn: socket.socket, line: bytes, identify: Identify, seal: Seal | None) -> None:
        entered: int | None = None
        try:
            try:
                uid, gid, body = identify(line)
            except CalqueError as exc:
                reply: bytes | None = answer(False, kind=_kind_of(exc), message=str(exc))
            else:
                crowded = self._enter(uid)
                if crowded is None:
                    entered = uid
                    reply = self._reply(conn, uid, gid, body)
                else:
                    log.warning("refused uid %d: %s", uid, crowded)
                    reply = answer(False, kind="refused", message=crowded)
            if reply is not None:
                conn.settimeout(5)
                conn.sendall(reply if seal is None else reply + seal(reply[:-1]))
        except OSError:
            pass
        except Exception:
            log.exception("unexpected error serving a broker connection")
        finally:
            conn.close()
            if entered is not None:
                self._leave(entered)

    def _reply(self, conn: socket.socket, uid: int, gid: int, body: bytes) -> bytes | None:
        if self.stopping.is_set():
            return answer(False, kind="busy", message="the broker is stopping; retry in a moment")
        try:
            req = BrokerRequest.model_validate_json(body)
            model = BROKER_REQUESTS[req.op]
            args = model.model_validate(req.args)
        except ValidationError as exc:
            return answer(False, kind=error_kind(exc), message=format_validation_error(exc, "bad broker request"))
        except CalqueError as exc:
            return answer(False, kind=_kind_of(exc), message=str(exc))
        try:
            c = caller(uid, gid, labs=self.labs, admin_group=self.config.admin_group)
            if req.as_user is not None:
                c = acting_for(
                    c,
                    req.as_user,
                    req.op,
                    hub_user=self.hub_user,
                    labs=self.labs,
                    admin_group=self.config.admin_group,
                    audit=self.audit,
                )
            return answer(True, self._dispatch(c, req.op, args, conn))
        except CalqueError as exc:
            return answer(False, kind=_kind_of(exc), message=str(exc))

    def _dispatch(self, c: Caller, op: str, args: object, conn: socket.socket) -> object:
        svc = self.service
        if op == "ping":
            return {"pong": True}
        if op == "anywhere":
            assert isinstance(args, AnywhereArgs)
            grant = svc.anywhere(c, args, alive=lambda: not closed(conn) and not self.stopping.is_set())
            return grant.model_dump(mode="json") if grant is not None else None
        if op == "queue":
            assert isinstance(args, QueueArgs)
            return svc.queue(c, args)
        if op == "cancel":
            assert isinstance(args, CancelArgs)
            return svc.cancel(c, args)
        if op == "hosts":
            return svc.hosts(c)
        if op == "on_host":
            assert isinstance(args, OnHostArgs)
            return svc.on_host(c, args)
        if op == "ledger":
            assert isinstance(args, LedgerArgs)
            return svc.usage(c, args)
        if op == "lab":
            return svc.lab(c)
        if op in ("reserve", "reservations", "unreserve"):
            return svc.reserving(c, op, args)
        assert isinstance(args, NudgeArgs)
        if not c.admin:  # a host's own nudge comes signed over UDP; anyone else's would cost a list each
            raise RefusedError("only root and the broker's admins may nudge it")
        if args.host in svc.cache.links:
            svc.dispatcher.nudge(args.host)
        return {"nudged": args.host in svc.cache.links}
