"""Contracts of the session service (Layer 2): slices, sessions, the socket protocol, usage reports.

A *slice* is one MIG device (named by its MIG UUID) or one configured MPS client slot; a *session*
binds one Unix user (as SO_PEERCRED reports them) to one slice until check-in, expiry or release.
Everything here crosses the daemon's socket, so the envelopes carry ``version``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import Field

from calque.models.base import CalqueModel, VersionedModel

# Bump when the socket protocol changes incompatibly; the daemon refuses other versions.
SESSION_PROTOCOL_VERSION = 1

SliceKind = Literal["mig", "mps"]
SessionOp = Literal["checkout", "checkin", "extend", "status", "list", "release", "report", "ping", "whoami", "adopt"]
ErrorKind = Literal["usage", "busy", "forbidden", "refused", "not_found", "protocol", "internal"]
# "layout": an admin's MIG layout change ended it (release with reason "layout") before destroying its device.
EndReason = Literal["checkin", "expired", "idle", "released", "vanished", "layout"]


class Slice(CalqueModel):
    """One unit a user can check out."""

    id: str = Field(description="MIG-<uuid> for MIG; mps-gpu<N>-slot<K> for an MPS slot")
    kind: SliceKind
    gpu_index: int = Field(ge=0)
    gpu_uuid: str
    profile: str = Field(description="MIG GPU-instance profile (1g.24gb) or 'mps'")
    # MIG only
    mig_uuid: str | None = None
    gpu_minor: int | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    memory_mib: int = 0
    # MPS only
    slot: int | None = None
    active_thread_percentage: int | None = None
    pinned_mem_limit_mib: int | None = None
    pipe_directory: str | None = None
    log_directory: str | None = None


class Session(VersionedModel):
    """One user's hold on one slice."""

    upgrade_hint: ClassVar[str] = "upgrade calque on this host so the daemon and its clients speak the same version"
    version_label: ClassVar[str] = "protocol"
    version: int = SESSION_PROTOCOL_VERSION
    id: str
    slice_id: str
    kind: SliceKind
    profile: str
    gpu_index: int
    uid: int
    gid: int
    user: str
    created_at: datetime
    expires_at: datetime
    notice_sent: bool = False
    ended_at: datetime | None = None
    end_reason: EndReason | None = None
    env: dict[str, str] = Field(default_factory=dict, description="what `checkout --shell` exports")
    spot: bool = Field(False, description="the host is a spot instance: an interruption ends every session")
    warnings: list[str] = Field(default_factory=list)

    def seconds_left(self, now: datetime) -> float:
        return max(0.0, (self.expires_at - now).total_seconds())


class SliceState(CalqueModel):
    """A slice and whether it is busy; ``holder`` and ``session_id`` only for admins and the holder."""

    slice: Slice
    busy: bool
    busy_until: datetime | None = None
    holder: str | None = None
    holder_uid: int | None = None
    session_id: str | None = None


class UsageRow(CalqueModel):
    """Hours held per user and profile, from the registry's usage table."""

    user: str
    uid: int
    profile: str
    kind: SliceKind
    sessions: int
    gpu_hours: float = Field(description="hours a slice was held (slice-hours, not weighted by slice size)")


class UsageReport(VersionedModel):
    upgrade_hint: ClassVar[str] = "upgrade calque on this host so the daemon and its clients speak the same version"
    version_label: ClassVar[str] = "protocol"
    version: int = SESSION_PROTOCOL_VERSION
    since: datetime
    until: datetime
    rows: list[UsageRow]


class SessionRequest(VersionedModel):
    """One request on the daemon's socket: one JSON object on one line."""

    upgrade_hint: ClassVar[str] = "upgrade calque on this host so the daemon and its clients speak the same version"
    version_label: ClassVar[str] = "protocol"
    version: int = SESSION_PROTOCOL_VERSION
    op: SessionOp
    args: dict[str, Any] = Field(default_factory=dict)


class SessionErrorBody(CalqueModel):
    kind: ErrorKind
    message: str


class SessionResponse(VersionedModel):
    """The daemon's answer: ``result`` when ``ok``, else ``error``."""

    upgrade_hint: ClassVar[str] = "upgrade calque on this host so the daemon and its clients speak the same version"
    version_label: ClassVar[str] = "protocol"
    version: int = SESSION_PROTOCOL_VERSION
    ok: bool
    result: Any = None
    error: SessionErrorBody | None = None
