"""The checks every receiver of a request from another host makes, host daemon and broker alike
(``daemon/crosshost.py``, ``broker/tcp.py``): who munge says sent it, and whether the credential was
made for this very request, to this receiver, by the user it names.

In order: this machine's munged decodes the credential (a bad, expired or replayed one is refused:
munged keeps the replay cache); its payload is the hash of this very body (a body changed after
signing is refused); the body names this receiver; the sender's user name has the credential's uid
here (a uid that differs by name is refused, naming both, and so is a user's credential naming
another user); ``as_user`` names another user only when the sender is one of ``may_act_for_others``
(the broker's service user; on a host, also the hub's, for its few ops: ``daemon/crosshost.py``).
Each refusal is a ``Refusal`` with a reason for the audit line; the receiver writes it.

Answers: the broker and the host daemons seal each TCP answer (``seal``: a second line, a credential
the answering process made over the request id and the answer line), and the client believes it only
from the answering side's service user (``check_seal``: the broker's, or the host's in institution.yaml).
"""

from __future__ import annotations

import hashlib
import json
import pwd
from dataclasses import dataclass
from pathlib import Path

from calque.errors import RefusedError
from calque.models.institution import SignedEnvelope
from calque.session import munge


class Refusal(Exception):
    """A request refused: ``reason`` for the audit trail, the message for the caller."""

    def __init__(self, reason: str, message: str, uid: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.uid = uid


@dataclass(frozen=True)
class Verified:
    credential: munge.Decoded
    acted_for: str  # the user the request acts for: the sender, or whom the broker names


def verify(
    req: SignedEnvelope, *, me: str, munge_socket: Path | None, may_act_for_others: str | frozenset[str] | None
) -> Verified:
    """``req``'s credential checked against ``req`` and this receiver (``me``); a Refusal otherwise.
    MungeUnavailable (no munged here) passes through: that is this host's fault, not the sender's."""
    try:
        cred = munge.decode(req.credential, socket=munge_socket)
    except munge.MungeError as exc:
        raise Refusal(f"credential_{exc.reason}", str(exc)) from exc
    if cred.payload != req.binding():
        raise Refusal(
            "payload_mismatch",
            "the credential was not made for this request (its body changed after signing)",
            cred.uid,
        )
    if req.host != me:
        raise Refusal("other_host", f"this request was made for host {req.host}; this is {me}", cred.uid)
    try:
        local_uid = pwd.getpwnam(req.user).pw_uid
    except KeyError:
        raise Refusal("unknown_user", f"no user {req.user} on {me}", cred.uid) from None
    if local_uid != cred.uid:
        raise Refusal(
            "uid_mismatch",
            f"user {req.user} is uid {local_uid} on {me} but uid {cred.uid} where the request was made; "
            "users must have the same uid on every host of the institution (a credential names its maker only)",
            cred.uid,
        )
    acted = req.as_user or req.user
    trusted = {may_act_for_others} if isinstance(may_act_for_others, str) else set(may_act_for_others or ())
    if acted != req.user and req.user not in trusted:
        who = f"the broker's or the hub's service user ({', '.join(sorted(trusted))})" if trusted else "no one here"
        raise Refusal(
            "acts_for_another", f"{req.user} may not act for {acted}: only {who} may name another user", cred.uid
        )
    return Verified(credential=cred, acted_for=acted)


# -- answers ------------------------------------------------------------------------------------------

ANSWER_PREFIX = b"calque-answer-1:"


def answer_binding(request_id: str, answer: bytes) -> bytes:
    """What a sealed answer's credential carries: the hash of the request id and the answer line."""
    return ANSWER_PREFIX + hashlib.sha256(request_id.encode() + b"\n" + answer).hexdigest().encode()


def seal(request_id: str, answer: bytes, *, munge_socket: Path | None) -> bytes:
    """The line that follows ``answer`` on the wire: a credential the answering process made, bound to
    the answer and the request it answers (so neither a forged answer nor an old one passes)."""
    return munge.encode(answer_binding(request_id, answer), socket=munge_socket).encode() + b"\n"


def _failure(answer: bytes) -> bool:
    try:
        return json.loads(answer).get("ok") is False
    except (ValueError, AttributeError):
        return False


def check_seal(
    request_id: str, answer: bytes, credential: bytes | None, *, munge_socket: Path | None, signer: str, who: str
) -> None:
    """Believe ``answer`` only when ``credential`` was made for it by ``signer`` (a user name, the same
    uid on every host): RefusedError otherwise, naming what was wrong. An unsealed failure passes: it
    grants nothing, and whoever could forge one could as well drop the connection."""
    if not credential:
        if _failure(answer):
            return  # a refusal made before any request was read (too many connections): only a failure
        raise RefusedError(f"{who} sent an answer with no seal: not believed (an older calque there, or an impostor)")
    try:
        signer_uid = pwd.getpwnam(signer).pw_uid
    except KeyError:
        raise RefusedError(f"the broker's service user {signer} has no uid on this host") from None
    try:
        cred = munge.decode(credential.decode("ascii", "replace"), socket=munge_socket)
    except munge.MungeError as exc:
        raise RefusedError(f"{who} sent an answer whose seal munge refused ({exc}): not believed") from exc
    if cred.uid != signer_uid:
        raise RefusedError(
            f"{who} answered as uid {cred.uid}, not as its service user {signer} (uid {signer_uid}): not believed"
        )
    if cred.payload != answer_binding(request_id, answer):
        raise RefusedError(f"{who} sent an answer its seal was not made for: not believed")
