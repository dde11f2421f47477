"""A request from another host (the TCP listener): who munge says sent it, whom it acts for, and
every reason to refuse it, each answered to the caller and written to the audit trail.

In order: the envelope parses; the checks every receiver makes (``session/signed.py``: the credential
decodes here, was made for this very body and this host, by the user it names; ``as_user`` only from
the broker's service user, or the hub's for ``HUB_OPS``); the op does not need a local process
(``adopt``: use ssh). Then the acted-for user, named and grouped by this host's NSS, is a ``Caller``
like any local one, no pid.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pwd
import socket
from typing import Any

from pydantic import ValidationError

from calque.errors import CalqueError, format_validation_error
from calque.models.institution import Institution, RemoteRequest
from calque.session import munge
from calque.session.daemon.identity import Caller
from calque.session.daemon.service import Service
from calque.session.daemon.wire import RequestError
from calque.session.signed import Refusal, seal, verify

log = logging.getLogger("calque.session")

# Ops that act on a process of the caller's on this host: over TCP there is none to name.
LOCAL_PROCESS_OPS = frozenset({"adopt"})
# What the institution's hub may ask a host for in a user's name: her notebook server in her own
# session (``notebook.py``), her sessions (the spawner's poll) and her check-in (its stop).
HUB_OPS = frozenset({"notebook", "status", "checkin"})


class CrossHost:
    """Authenticates requests from other hosts for ``service``; ``peer`` is the client's address."""

    def __init__(self, service: Service, institution: Institution) -> None:
        self.service = service
        cfg = service.host.config
        self.name = cfg.host_name or socket.gethostname()
        self.munge_socket = cfg.munge_socket
        self.broker_user = institution.broker.service_user if institution.broker is not None else None
        self.hub_user = institution.hub.service_user if institution.hub is not None else None
        self.may_act_for_others = frozenset(u for u in (self.broker_user, self.hub_user) if u is not None)

    def serve(self, line: bytes, peer: str) -> Any:
        """The service's answer to ``line``; RequestError for a refusal (already audited)."""
        try:
            req = RemoteRequest.model_validate_json(line)
        except ValidationError as exc:
            raise self._refuse("protocol", format_validation_error(exc, "bad request"), peer, None) from exc
        except ValueError as exc:  # not UTF-8, not JSON
            raise self._refuse("protocol", f"bad request: {exc}", peer, None) from exc
        caller = self.authenticate(req, peer)
        try:
            return self.service.handle(caller, req.op, req.args)
        except RequestError:
            raise
        except CalqueError as exc:
            raise RequestError("internal", str(exc)) from exc

    def seal(self, line: bytes, answer: bytes) -> bytes:
        """The line after ``answer``: a credential of this daemon's own over it and the request's id
        (``signed.seal``), so the sender knows this host's daemon answered; an empty line when munged
        cannot make one (the sender then refuses the answer and says so)."""
        try:
            request_id = json.loads(line).get("request_id")
        except (ValueError, AttributeError):
            request_id = None
        try:
            return seal(request_id if isinstance(request_id, str) else "", answer, munge_socket=self.munge_socket)
        except munge.MungeUnavailable as exc:
            log.error("cannot seal an answer: %s", exc)
            return b"\n"

    def authenticate(self, req: RemoteRequest, peer: str) -> Caller:
        try:
            ok = verify(req, me=self.name, munge_socket=self.munge_socket, may_act_for_others=self.may_act_for_others)
        except Refusal as r:
            raise self._refuse(r.reason, r.message, peer, req, uid=r.uid) from r
        except munge.MungeUnavailable as exc:
            log.error("cannot decode a request from %s: %s", peer, exc)
            raise RequestError(
                "internal", f"the session daemon on {self.name} cannot check credentials: {exc}"
            ) from exc
        uid = ok.credential.uid
        door = self.service.door
        from_broker = door.broker is not None and door.is_broker(uid)
        # The hub's user acts for others only to run their notebook servers (when it is the broker's too,
        # the broker's rights apply).
        for_hub = req.user == self.hub_user and req.user != self.broker_user and ok.acted_for != req.user
        if for_hub and req.op not in HUB_OPS:
            raise self._refuse(
                "hub_op",
                f"the hub's service user may ask only {', '.join(sorted(HUB_OPS))} for another user, not {req.op}",
                peer,
                req,
                uid=uid,
            )
        if from_broker:
            door.heard()  # the broker answers: checkouts here keep its queue's order
        if req.op in LOCAL_PROCESS_OPS:
            raise self._refuse(
                "needs_local_process",
                f"{req.op} moves a process of yours on {self.name} into the session: run it there "
                f"(ssh -t {self.name} calque session shell --session ID)",
                peer,
                req,
                uid=uid,
                kind="usage",
            )
        try:
            pw = pwd.getpwnam(ok.acted_for)
        except KeyError:
            raise self._refuse("unknown_user", f"no user {ok.acted_for} on {self.name}", peer, req, uid=uid) from None
        caller = self.service.caller(0, pw.pw_uid, pw.pw_gid)
        if for_hub:
            return dataclasses.replace(caller, via_hub=True)
        return dataclasses.replace(caller, via_broker=True) if from_broker else caller

    def _refuse(
        self,
        reason: str,
        message: str,
        peer: str,
        req: RemoteRequest | None,
        *,
        uid: int | None = None,
        kind: str = "forbidden",
    ) -> RequestError:
        fields: dict[str, Any] = {"reason": reason, "peer": peer, "message": message, "credential_uid": uid}
        if req is not None:
            fields.update(op=req.op, request_id=req.request_id, user=req.user, as_user=req.as_user, host=req.host)
        self.service.host.audit.event("remote_refused", **fields)
        return RequestError("usage" if kind == "usage" else "forbidden", message)
