"""A request that crosses hosts: a session daemon's op over TCP, vouched for by a munge credential.

The credential is made by the caller's own process (munge vouches for its uid and gid) and its
payload is ``binding(...)``: a hash of the canonical JSON of everything the request asks, so a body
changed after signing, or the request sent to another host, no longer matches. The answer is the
session protocol's ``SessionResponse``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, StrictInt, StrictStr

from calque.models.base import VersionedModel
from calque.models.session import SESSION_PROTOCOL_VERSION, SessionOp

_DEFERRED = ConfigDict(defer_build=True)
MAX_CREDENTIAL = 8192  # a munge credential of a 64-byte payload is about 200 characters
BINDING_PREFIX = b"calque-crossing-v1:"

UserName = StrictStr


def binding(op: str, args: dict[str, Any], request_id: str, host: str, as_user: str | None, user: str) -> bytes:
    """The credential's payload: a prefix and the SHA-256 of the request's canonical JSON."""
    doc = {"op": op, "args": args, "request_id": request_id, "host": host, "as_user": as_user, "user": user}
    canon = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return BINDING_PREFIX + hashlib.sha256(canon.encode()).hexdigest().encode()


class CrossingRequest(VersionedModel):
    """One request on a host daemon's TCP port: one JSON object on one line."""

    model_config = _DEFERRED
    upgrade_hint: ClassVar[str] = "upgrade calque on both hosts so they speak the same version"
    version_label: ClassVar[str] = "protocol"
    version: StrictInt = SESSION_PROTOCOL_VERSION
    op: SessionOp
    args: dict[str, Any] = Field(default_factory=dict)
    request_id: StrictStr = Field(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    host: StrictStr = Field(min_length=1, max_length=253, description="the host this request is for")
    user: UserName = Field(min_length=1, max_length=64, description="the caller's user name (the credential's uid)")
    as_user: UserName | None = Field(
        None, min_length=1, max_length=64, description="the user the broker acts for (its service uid only)"
    )
    credential: StrictStr = Field(min_length=1, max_length=MAX_CREDENTIAL)

    def binding(self) -> bytes:
        return binding(self.op, self.args, self.request_id, self.host, self.as_user, self.user)
