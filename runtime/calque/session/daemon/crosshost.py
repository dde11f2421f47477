"""A request from another host (the TCP listener): who munge says sent it, whom it acts for, and
every reason to refuse it, each answered to the caller and written to the audit trail.

In order: the envelope parses; this host's munged decodes the credential (a bad, expired or replayed
one is refused: munged keeps the replay cache, shared by every worker process); its payload is the
hash of this very body (a body changed after signing is refused); the body names this host; the
sender's user name has the credential's uid on this host (a uid that differs by name is refused,
naming both); ``as_user`` names another user only when the credential's uid is the broker's service
uid; the op does not need a local process (``adopt``: use ssh). Then the acted-for user, named and
grouped by this host's NSS, is a ``Caller`` like any local one, with no pid.
"""

from __future__ import annotations

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

log = logging.getLogger("calque.session")

# Ops that act on a process of the caller's on this host: over TCP there is none to name.
LOCAL_PROCESS_OPS = frozenset({"adopt"})


class CrossHost:
    """Authenticates requests from other hosts for ``service``; ``peer`` is the client's address."""

    def __init__(self, service: Service, institution: Institution) -> None:
        self.service = service
        cfg = service.host.config
        self.name = cfg.host_name or socket.gethostname()
        self.munge_socket = cfg.munge_socket
        self.broker_user = institution.broker.service_user if institution.broker is not None else None

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

    def authenticate(self, req: RemoteRequest, peer: str) -> Caller:
        try:
            cred = munge.decode(req.credential, socket=self.munge_socket)
        except munge.MungeError as exc:
            raise self._refuse(f"credential_{exc.reason}", str(exc), peer, req) from exc
        except munge.MungeUnavailable as exc:
            log.error("cannot decode a request from %s: %s", peer, exc)
            raise RequestError(
                "internal", f"the session daemon on {self.name} cannot check credentials: {exc}"
            ) from exc
        if cred.payload != req.binding():
            raise self._refuse(
                "payload_mismatch",
                "the credential was not made for this request (its body changed after signing)",
                peer,
                req,
                uid=cred.uid,
            )
        if req.host != self.name:
            raise self._refuse(
                "other_host", f"this request was made for host {req.host}; this is {self.name}", peer, req, uid=cred.uid
            )
        local_uid = self._uid_of(req.user, peer, req, cred.uid)
        if local_uid != cred.uid:
            raise self._refuse(
                "uid_mismatch",
                f"user {req.user} is uid {local_uid} on {self.name} but uid {cred.uid} where the request was made; "
                "users must have the same uid on every host of the institution",
                peer,
                req,
                uid=cred.uid,
            )
        acted = req.as_user or req.user
        if acted != req.user and (self.broker_user is None or req.user != self.broker_user):
            who = (
                f"the broker's service user ({self.broker_user})"
                if self.broker_user
                else "no one (no broker configured)"
            )
            raise self._refuse(
                "acts_for_another",
                f"{req.user} may not act for {acted}: only {who} may name another user",
                peer,
                req,
                uid=cred.uid,
            )
        if req.op in LOCAL_PROCESS_OPS:
            raise self._refuse(
                "needs_local_process",
                f"{req.op} moves a process of yours on {self.name} into the session: run it there "
                f"(ssh -t {self.name} calque session shell --session ID)",
                peer,
                req,
                uid=cred.uid,
                kind="usage",
            )
        try:
            pw = pwd.getpwnam(acted)
        except KeyError:
            raise self._refuse("unknown_user", f"no user {acted} on {self.name}", peer, req, uid=cred.uid) from None
        return self.service.caller(0, pw.pw_uid, pw.pw_gid)

    def _uid_of(self, user: str, peer: str, req: RemoteRequest, cred_uid: int) -> int:
        try:
            return pwd.getpwnam(user).pw_uid
        except KeyError:
            raise self._refuse("unknown_user", f"no user {user} on {self.name}", peer, req, uid=cred_uid) from None

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
