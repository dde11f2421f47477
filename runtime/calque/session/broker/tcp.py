"""The broker's TCP port: researchers on other hosts. Each request is a ``RemoteBrokerRequest``: the
broker's own request, plus a munge credential the researcher's process made, bound to the request
(op, arguments, request id) and to the broker's name. The checks are every receiver's
(``session/signed.py``); over TCP only the institution's hub may act for another user (``as_user``),
and only as ``hub.py`` allows.
Each refusal is answered and written to the broker's audit trail, one line each. Every answer is
followed by a seal (``signed.seal``) so the researcher's client knows the broker made it.
"""

from __future__ import annotations

import logging
import pwd
from pathlib import Path

from pydantic import ValidationError

from calque.errors import InfrastructureError, RefusedError, UsageError, format_validation_error
from calque.models.broker import RemoteBrokerRequest
from calque.session import munge
from calque.session.broker.audit import BrokerAudit
from calque.session.signed import Refusal, seal, verify

log = logging.getLogger("calque.broker")


class TcpIdentify:
    """One TCP connection's request: ``identify`` (what ``BrokerServer`` calls on its line: uid, gid and
    the plain request, or an error) and ``seal`` (the line proving the broker made the answer)."""

    def __init__(
        self, name: str, munge_socket: Path | None, audit: BrokerAudit, peer: str, hub_user: str | None = None
    ) -> None:
        self.name = name
        self.hub_user = hub_user  # may name ``as_user`` here; the server then applies ``hub.py``'s rules
        self.munge_socket = munge_socket
        self.audit = audit
        self.peer = peer
        self.request_id = ""  # the answer is bound to it; "" until a request parsed

    def seal(self, answer: bytes) -> bytes:
        try:
            return seal(self.request_id, answer, munge_socket=self.munge_socket)
        except munge.MungeUnavailable as exc:  # the client refuses an unsealed answer and says so
            log.error("cannot seal an answer to %s: %s", self.peer, exc)
            return b"\n"

    def identify(self, line: bytes) -> tuple[int, int, bytes]:
        try:
            req = RemoteBrokerRequest.model_validate_json(line)
        except ValidationError as exc:
            message = format_validation_error(exc, "bad broker request")
            self._audit("protocol", message, None)
            raise UsageError(message) from exc
        except ValueError as exc:  # not UTF-8, not JSON
            self._audit("protocol", f"bad broker request: {exc}", None)
            raise UsageError(f"bad broker request: {exc}") from exc
        self.request_id = req.request_id
        try:
            ok = verify(req, me=self.name, munge_socket=self.munge_socket, may_act_for_others=self.hub_user)
        except Refusal as r:
            self._audit(r.reason, r.message, req, uid=r.uid)
            raise RefusedError(r.message) from r
        except munge.MungeUnavailable as exc:
            log.error("cannot decode a request from %s: %s", self.peer, exc)
            raise InfrastructureError(f"the broker cannot check credentials: {exc}") from exc
        uid = ok.credential.uid
        gid = pwd.getpwuid(uid).pw_gid  # this host's groups for the user, not the sending host's gid
        return uid, gid, req.plain().model_dump_json().encode()

    def _audit(self, reason: str, message: str, req: RemoteBrokerRequest | None, *, uid: int | None = None) -> None:
        fields: dict[str, object] = {"reason": reason, "peer": self.peer, "message": message, "credential_uid": uid}
        if req is not None:
            fields.update(op=req.op, request_id=req.request_id, user=req.user, as_user=req.as_user, host=req.host)
        self.audit.event("remote_refused", **fields)
        log.warning("refused a request from %s: %s (%s)", self.peer, reason, message)
