"""Who is calling from another host: a munge credential checked by this host's own munged, and the
request it was made for.

A request over TCP names its caller's user and carries a munge credential whose payload binds the
whole request (``calque.models.crossing.binding``). It is served only when munged vouches for the
credential (this institution's key, within its time to live, never seen before: munged's replay
cache), the payload is this very request made for this host, the user's uid here is the
credential's uid (users map by name, so a uid that differs between hosts is refused), and an
``as_user`` other than the caller is named only by the broker's service user. Every refusal goes
back to the caller and into the audit trail.
"""

from __future__ import annotations

import logging
import pwd
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from calque.errors import format_validation_error
from calque.models.crossing import CrossingRequest
from calque.models.session import ErrorKind
from calque.session import munge
from calque.session.daemon.audit import AuditLog
from calque.session.daemon.identity import Caller, Identities, user_name
from calque.session.daemon.wire import RequestError

log = logging.getLogger("calque.session")

# Ops that act on a process of the caller's on this host: they need SO_PEERCRED's pid, so only the
# unix socket serves them.
LOCAL_ONLY_OPS = frozenset({"adopt"})


def _uid_of(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


class Crossing:
    """Checks requests from other hosts for ``host_name`` and names their caller."""

    def __init__(
        self,
        host_name: str,
        identities: Identities,
        audit: AuditLog,
        *,
        broker_users: list[str],
        munge_socket: Path | None = None,
    ) -> None:
        self.host_name = host_name
        self.identities = identities
        self.audit = audit
        self.broker_users = broker_users
        self.munge_socket = munge_socket

    def _refuse(
        self,
        reason: str,
        message: str,
        peer: str,
        req: CrossingRequest | None,
        kind: ErrorKind = "forbidden",
        **more: Any,
    ) -> RequestError:
        fields: dict[str, Any] = {"reason": reason, "peer": peer, "message": message, **more}
        if req is not None:
            fields.update(op=req.op, request_id=req.request_id, for_host=req.host, user=req.user, as_user=req.as_user)
        try:
            self.audit.event("crossing_refused", **fields)
        except OSError as exc:
            log.error("cannot audit a refused request from %s: %s", peer, exc)
        log.warning("refused a request from %s: %s", peer, message)
        return RequestError(kind, message)

    def parse(self, line: bytes, peer: str) -> CrossingRequest:
        try:
            return CrossingRequest.model_validate_json(line)
        except ValidationError as exc:
            raise RequestError("protocol", format_validation_error(exc, "bad request")) from exc
        except (ValueError, RecursionError) as exc:
            raise RequestError("protocol", f"bad request: {exc}") from exc

    def caller(self, req: CrossingRequest, peer: str) -> Caller:
        """The user this request acts for, as this host's NSS knows them; RequestError (audited) if refused."""
        try:
            cred = munge.decode(req.credential, socket=self.munge_socket)
        except munge.MungeError as exc:
            if exc.status not in munge.CREDENTIAL_FAULTS:
                log.error("munged on this host failed: %s", exc)
                raise RequestError("internal", f"host {self.host_name} cannot check credentials now: {exc}") from exc
            raise self._refuse(exc.status.name.lower(), str(exc), peer, req) from exc
        if cred.payload != req.binding():
            raise self._refuse(
                "mismatch",
                "the request does not match its munge credential (changed after it was signed, or signed for another)",
                peer,
                req,
                uid=cred.uid,
            )
        if req.host != self.host_name:
            raise self._refuse(
                "other_host", f"the request was made for host {req.host}; this is {self.host_name}", peer, req
            )
        here = _uid_of(req.user)
        if here != cred.uid:
            local = user_name(cred.uid)
            what = f"uid {here} on host {self.host_name}" if here is not None else f"no account on {self.host_name}"
            raise self._refuse(
                "uid_mismatch",
                f"user {req.user} has {what}, but the credential is uid {cred.uid}"
                + (f" ({local} here)" if local != str(cred.uid) else "")
                + ": a user's uid must be the same on every host of the institution",
                peer,
                req,
                uid=cred.uid,
            )
        acted = req.user
        if req.as_user is not None and req.as_user != req.user:
            if req.user not in self.broker_users:
                raise self._refuse(
                    "not_broker",
                    f"{req.user} may not act for {req.as_user}: only the broker's service user "
                    f"({', '.join(self.broker_users)}) makes requests for other users",
                    peer,
                    req,
                    uid=cred.uid,
                )
            acted = req.as_user
        if req.op in LOCAL_ONLY_OPS:
            raise self._refuse(
                "local_only",
                f"{req.op} joins a process on host {self.host_name} to a session: run it there "
                f"(ssh {self.host_name} calque session shell --session ID)",
                peer,
                req,
                kind="usage",
            )
        try:
            pw = pwd.getpwnam(acted)
        except KeyError as exc:
            raise self._refuse("no_user", f"user {acted} has no account on host {self.host_name}", peer, req) from exc
        return self.identities.caller(0, pw.pw_uid, pw.pw_gid)
