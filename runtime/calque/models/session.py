"""Contracts of the session service (Layer 2): slices, sessions, the socket protocol, usage reports.

A *slice* is one MIG device (named by its MIG UUID) or one configured MPS client slot; a *session*
binds one Unix user (as SO_PEERCRED reports them) to one slice until check-in, expiry or release.
Everything here crosses the daemon's socket, so the envelopes carry ``version`` (a strict integer:
``"2"`` and ``2.0`` are refused, not read as 2). Each operation's arguments (``CheckoutArgs`` with
its rules as validators, so a checkout's rules exist once) and its answer are defined at the end of
this module, which both the client (``calque.session.client``) and the daemon import.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from calque.durations import parse_duration
from calque.models.base import CalqueModel, Duration, VersionedModel, positive_seconds
from calque.models.notebook import NotebookArgs
from calque.models.session_args import RequestArgs as RequestArgs
from calque.models.session_args import SessionId as SessionId
from calque.models.session_args import SessionRefArgs as SessionRefArgs
from calque.models.versions import SESSION_PROTOCOL_VERSION
from calque.timefmt import utc_text

# A researcher's `calque session status` validates one or two of these models: each builds its
# validator on first use, not when this module is imported (bench/cli_startup.py).
_DEFERRED = ConfigDict(defer_build=True)


SliceKind = Literal["mig", "mps"]
_USER = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\$?$"  # a Unix user name, as ``models/institution.py``'s UserName
SessionOp = Literal[
    "checkout",
    "checkin",
    "extend",
    "status",
    "list",
    "release",
    "report",
    "ping",
    "whoami",
    "adopt",
    "metrics",
    "ledger",  # the host's usage events, priced (calque report; calque.models.ledger)
    "budget_override",  # an admin's audited extra allowance for a lab this month
    "budget_elsewhere",  # the broker: each lab's month on the institution's other hosts
    "drain",
    "undrain",
    "drains",
    "door",  # whether checkouts here go through the institution's queue (models/door.py)
    "notebook",  # the single-user server as the session's user in its cgroup (models/notebook.py)
]
ErrorKind = Literal["usage", "busy", "forbidden", "refused", "not_found", "protocol", "internal"]
# "layout": an admin's MIG layout change ended it (release with reason "layout") before destroying its device.
# "drained": it reached the deadline a drain with ``--by`` set (``calque session drain``).
EndReason = Literal["checkin", "expired", "idle", "released", "vanished", "layout", "drained"]


class Slice(CalqueModel):
    """One unit a user can check out."""

    model_config = _DEFERRED

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

    model_config = _DEFERRED

    upgrade_hint: ClassVar[str] = "upgrade calque on this host so the daemon and its clients speak the same version"
    version_label: ClassVar[str] = "protocol"
    version: StrictInt = SESSION_PROTOCOL_VERSION
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
    # The idle clock, where the host reclaims idle slices (``idle`` in session.yaml) and the holder is
    # not exempt: when the slice was last seen active, and when the session ends if it stays idle.
    active_at: datetime | None = None
    idle_ends_at: datetime | None = None
    idle_exempt: bool = Field(False, description="the holder's group is exempt from idle reclaim")

    def seconds_left(self, now: datetime) -> float:
        return max(0.0, (self.expires_at - now).total_seconds())


class Drain(CalqueModel):
    """A drain of this host (``gpu`` None) or of one GPU: no new checkouts there; live sessions run to
    their own deadlines, or to ``deadline`` when the drain set one (``--by``)."""

    model_config = _DEFERRED

    gpu: int | None = Field(None, description="the GPU index drained; None: the whole host")
    reason: str
    by_user: str = Field(description="who drained it (root or a member of the admin group)")
    by_uid: int
    since: datetime
    deadline: datetime | None = Field(None, description="live sessions there end by then (None: at their own)")

    def describe(self) -> str:
        """One sentence for a refusal, naming where, who and why."""
        where = "this host" if self.gpu is None else f"GPU {self.gpu}"
        until = f"; live sessions there end by {utc_text(self.deadline)}" if self.deadline else ""
        return f"{where} is drained by {self.by_user} since {utc_text(self.since)}: {self.reason}{until}"


class SliceState(CalqueModel):
    """A slice and whether it is busy; ``holder`` and ``session_id`` only for admins and the holder;
    ``why_not`` on a free slice the caller would be refused (the serialised-per-user MPS rule), and on
    any MPS slot whose control daemon does not answer (``unavailable``: nobody can use it now)."""

    model_config = _DEFERRED

    slice: Slice
    busy: bool
    busy_until: datetime | None = None
    holder: str | None = None
    holder_uid: int | None = None
    session_id: str | None = None
    why_not: str | None = Field(
        default=None, description="why the caller cannot check out (or use) this slot now (None: they can)"
    )
    unavailable: bool = Field(
        default=False, description="an MPS slot whose control daemon does not answer: offered to nobody"
    )
    drained: Drain | None = Field(default=None, description="its GPU (or the host) is drained: offered to nobody")


class UsageRow(CalqueModel):
    """Hours held per user and profile, from the registry's usage table."""

    model_config = _DEFERRED

    user: str
    uid: int
    profile: str
    kind: SliceKind
    sessions: int
    gpu_hours: float = Field(description="hours a slice was held (slice-hours, not weighted by slice size)")


class UsageReport(VersionedModel):
    model_config = _DEFERRED
    upgrade_hint: ClassVar[str] = "upgrade calque on this host so the daemon and its clients speak the same version"
    version_label: ClassVar[str] = "protocol"
    version: StrictInt = SESSION_PROTOCOL_VERSION
    since: datetime
    until: datetime
    rows: list[UsageRow]


class SessionRequest(VersionedModel):
    """One request on the daemon's socket: one JSON object on one line."""

    model_config = _DEFERRED

    upgrade_hint: ClassVar[str] = "upgrade calque on this host so the daemon and its clients speak the same version"
    version_label: ClassVar[str] = "protocol"
    version: StrictInt = SESSION_PROTOCOL_VERSION
    op: SessionOp
    args: dict[str, Any] = Field(default_factory=dict)
    # The institution's broker on this machine (``broker/local.py``): honoured only from its service
    # user's uid (SO_PEERCRED), as a TCP request's ``as_user`` only from its munge credential.
    broker: StrictBool = False
    as_user: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=_USER)] | None = None


class SessionErrorBody(CalqueModel):
    model_config = _DEFERRED
    kind: ErrorKind
    message: str


class SessionResponse(VersionedModel):
    """The daemon's answer: ``result`` when ``ok``, else ``error``."""

    model_config = _DEFERRED

    upgrade_hint: ClassVar[str] = "upgrade calque on this host so the daemon and its clients speak the same version"
    version_label: ClassVar[str] = "protocol"
    version: StrictInt = SESSION_PROTOCOL_VERSION
    ok: bool
    result: Any = None
    error: SessionErrorBody | None = None


# -- each operation's arguments and answer ------------------------------------------------------
#
# Unknown keys are refused by name (a misspelled ``"tll"`` is an error, not the default TTL), consent
# is a real JSON ``true``, numbers are finite and in range, strings are bounded, and no value nests:
# every argument is a scalar. A rule broken is a ``usage`` error unless its error type says
# ``refused`` (``error_kind``): the client and the daemon answer it the same way.


class CheckoutArgs(RequestArgs):
    """A checkout: one rule set, checked by the client before it sends and by the daemon on receipt."""

    model_config = _DEFERRED

    profile: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None
    mps: StrictBool = False
    gpu: Annotated[StrictInt, Field(ge=0, le=1023)] | None = None
    ttl: Duration | None = None
    consent: StrictBool = Field(False, description="MPS only: the caller accepts a GPU shared with no isolation")
    request_id: Annotated[StrictStr, Field(max_length=128)] | None = None
    # The broker's: when a request it grants joined its queue (epoch seconds). The host records the
    # wait as demand (``session/daemon/demand.py``); it grants nothing and changes no limit.
    queued_since: Annotated[StrictFloat, Field(ge=0, allow_inf_nan=False)] | None = None
    direct: StrictBool = Field(False, description="an admin's audited checkout past the institution's queue")
    lab: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = Field(None, description="bill this lab")

    @model_validator(mode="after")
    def _rules(self) -> CheckoutArgs:
        if self.mps and self.profile:
            raise ValueError("give either --mps or --profile, not both")
        if self.mps and not self.consent:
            raise PydanticCustomError(
                "refused",
                "an MPS slot shares one GPU's memory and faults with other users, with no isolation; "
                "pass --i-understand-shared-gpu-has-no-isolation to accept that",
            )
        if self.ttl is not None:
            positive_seconds(self.ttl, "--ttl")
        return self

    @property
    def kind(self) -> SliceKind:
        return "mps" if self.mps else "mig"


class ExtendArgs(SessionRefArgs):
    model_config = _DEFERRED
    by: Duration

    @model_validator(mode="after")
    def _positive(self) -> ExtendArgs:
        positive_seconds(self.by, "--by")
        return self


class ReleaseArgs(RequestArgs):
    """An admin's release of anyone's session; ``reason`` goes to the audit trail."""

    model_config = _DEFERRED

    id: SessionId
    force: StrictBool = False
    reason: Annotated[StrictStr, Field(max_length=500)] | None = None


class DrainArgs(RequestArgs):
    """An admin's drain of the host (``gpu`` None) or of one GPU; ``by``: live sessions end that soon."""

    model_config = _DEFERRED

    gpu: Annotated[StrictInt, Field(ge=0, le=1023)] | None = None
    by: Duration | None = None
    reason: Annotated[StrictStr, Field(min_length=1, max_length=500)]

    @model_validator(mode="after")
    def _positive(self) -> DrainArgs:
        if self.by is not None:
            positive_seconds(self.by, "--by")
        if not self.reason.strip():
            raise ValueError("--reason must say why (it is shown to everyone refused a checkout there)")
        return self


class UndrainArgs(RequestArgs):
    """``gpu`` None: every drain of the host (its own and each GPU's); else that GPU's only."""

    model_config = _DEFERRED

    gpu: Annotated[StrictInt, Field(ge=0, le=1023)] | None = None


class Drained(CalqueModel):
    """``drain``'s answer: the drain as recorded, and the live sessions it covers (with their deadlines)."""

    model_config = _DEFERRED

    drain: Drain
    sessions: list[Session] = Field(default_factory=list)
    shortened: list[str] = Field(default_factory=list, description="sessions whose deadline the drain moved in")


class ReportArgs(RequestArgs):
    model_config = _DEFERRED
    since: Duration = "7d"

    @model_validator(mode="after")
    def _parses(self) -> ReportArgs:
        parse_duration(self.since, what="--since")
        return self


class LedgerArgs(ReportArgs):
    """``ledger``: the host's usage events over ``since`` (a user's own; every user's for an admin)."""

    model_config = _DEFERRED
    since: Duration = "30d"


class BudgetOverrideArgs(RequestArgs):
    """``budget_override``: ``extra`` more of the lab's budget unit this month, for ``reason`` (audited)."""

    model_config = _DEFERRED
    lab: str = Field(min_length=1, max_length=64)
    extra: float = Field(gt=0, description="in the budget's unit: GPU-hours or USD")
    reason: str = Field(min_length=1, max_length=500)


class LabUse(CalqueModel):
    model_config = _DEFERRED
    gpu_hours: float = Field(ge=0)
    usd: float = Field(ge=0)


class BudgetElsewhereArgs(RequestArgs):
    """``budget_elsewhere``: each lab's ``month`` on the institution's other hosts and its pools (the broker's sum)."""

    model_config = _DEFERRED
    month: str = Field(pattern=r"^\d{4}-\d{2}$")
    labs: dict[str, LabUse] = Field(default_factory=dict)


REQUESTS: dict[str, type[RequestArgs]] = {
    "checkout": CheckoutArgs,
    "checkin": SessionRefArgs,
    "adopt": SessionRefArgs,
    "extend": ExtendArgs,
    "status": SessionRefArgs,  # with an id: that one of hers, ended or not (how it ended)
    "list": RequestArgs,
    "release": ReleaseArgs,
    "report": ReportArgs,
    "ping": RequestArgs,
    "whoami": RequestArgs,
    "metrics": RequestArgs,
    "ledger": LedgerArgs,
    "budget_override": BudgetOverrideArgs,
    "budget_elsewhere": BudgetElsewhereArgs,
    "drain": DrainArgs,
    "undrain": UndrainArgs,
    "drains": RequestArgs,
    "door": RequestArgs,
    "notebook": NotebookArgs,
}


def error_kind(exc: ValidationError) -> Literal["usage", "refused"]:
    """``refused`` when a rule that refuses (MPS without consent) was broken, else ``usage``."""
    return "refused" if any(e["type"] == "refused" for e in exc.errors()) else "usage"
