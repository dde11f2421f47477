"""Contracts of the ledger (``calque report``): usage events from sessions and pools, priced twice.

A ``UsageEvent`` is one stretch of GPU use: a session's slice held (its seconds weighted by the
slice's share of its GPU: a 1g.24gb of a 4-slice RTX PRO 6000 is 1/4 GPU), or a pool instance's
seconds, busy (serving claims, from the workers' Summaries) or warm-idle (up and serving nothing, from
its group's instance lifecycle). Each is priced at the EC2 on-demand rate of its instance type (per
GPU, pro rata) and, beside it, at Modal's published per-second price for the same GPU class: a pool's
warm-idle seconds cost nothing on Modal, which bills only while a container runs.

A ``HostLedger`` is what one host's daemon answers (``ledger`` op) and what the broker keeps of each
host's last answer; a ``LedgerReport`` is the rows ``calque report`` prints.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, StrictInt

from calque.models.base import CalqueModel, VersionedModel
from calque.models.reservation import OccurrenceUse
from calque.models.versions import SESSION_PROTOCOL_VERSION

_DEFERRED = ConfigDict(defer_build=True)

UsageSource = Literal["session", "pool-busy", "pool-idle"]
LedgerKey = Literal["lab", "user", "pool", "profile", "host", "source"]


class UsageEvent(CalqueModel):
    """One stretch of GPU use, clipped to the report's window, priced at EC2's and at Modal's rate."""

    model_config = _DEFERRED

    source: UsageSource
    host: str | None = Field(None, description="the session host (sessions) or None (pools)")
    pool: str | None = Field(None, description="the pool's name, lab-a/embedder (pools)")
    lab: str | None = Field(
        None, description="the lab: the user's Unix groups (sessions), the pool name's first segment"
    )
    user: str | None = None
    profile: str = Field(description="a MIG profile, 'mps', or the instance type of a pool")
    card: str | None = Field(None, description="the GPU's catalog key (A100-40GB); None when unknown")
    started_at: datetime
    ended_at: datetime
    seconds: float = Field(ge=0, description="wall seconds inside the window")
    gpu_fraction: float = Field(gt=0, description="GPUs this use held: 1/4 for a 1g of a 4-slice card, 8 for p4d")
    gpu_seconds: float = Field(ge=0, description="seconds x gpu_fraction")
    ec2_usd: float | None = Field(None, description="at the EC2 on-demand rate (per GPU, pro rata); None: unpriced")
    modal_usd: float | None = Field(None, description="at Modal's per-second price for the GPU class; None: no class")


class HostLedger(VersionedModel):
    """One host's usage events in a window: its daemon's answer, or the broker's copy of its last one."""

    model_config = _DEFERRED
    upgrade_hint: ClassVar[str] = "upgrade calque on this host so the daemon and its clients speak the same version"
    version_label: ClassVar[str] = "protocol"
    version: StrictInt = SESSION_PROTOCOL_VERSION
    host: str
    taken_at: datetime = Field(description="when the host answered")
    since: datetime
    until: datetime
    events: list[UsageEvent]
    stale: bool = Field(False, description="the host did not answer now: this is its last answer, from taken_at")
    budgets: list[LabSpend] = Field(
        default_factory=list,
        description="each budgeted lab's month as this host's checkout gate sees it (with the broker's sum of others)",
    )


class LedgerRow(CalqueModel):
    key: str = Field(description="the lab, user, pool or profile ('-' for none)")
    events: int
    gpu_hours: float
    ec2_usd: float
    modal_usd: float
    ratio: float | None = Field(None, description="modal_usd / ec2_usd (None when nothing was priced at EC2)")
    unpriced_events: int = Field(0, description="events with no EC2 or no Modal price (counted in GPU-hours only)")
    stale: bool = Field(False, description="some of it comes from a host's last answer, not a fresh one")


class SourceState(CalqueModel):
    """Where a report's events came from: a host (fresh or stale) or a pool."""

    name: str
    kind: Literal["host", "pool"]
    taken_at: datetime
    stale: bool = False


class Reconciliation(CalqueModel):
    """A pool's whole days as the ledger prices them beside what Cost Explorer billed to its ``calque:pool`` tag."""

    pool: str
    start: str = Field(description="the first day, YYYY-MM-DD (UTC)")
    end: str = Field(description="the day after the last, YYYY-MM-DD (Cost Explorer's exclusive end)")
    ledger_usd: float = Field(description="the pool's instance-seconds at EC2 rates, from its usage records")
    billed_usd: float | None = Field(description="Cost Explorer's UnblendedCost for the tag; None: it has nothing")
    estimated: bool = Field(False, description="Cost Explorer marks some of these days estimated (not final)")


class LedgerReport(CalqueModel):
    by: LedgerKey
    since: datetime
    until: datetime
    rows: list[LedgerRow]
    total: LedgerRow
    sources: list[SourceState]
    warnings: list[str] = Field(
        default_factory=list, description="where a pool's group history disagrees with its usage records"
    )
    reconciled: list[Reconciliation] = Field(default_factory=list, description="calque report --reconcile")
    reservations: list[OccurrenceUse] = Field(
        default_factory=list, description="--institution: each class reservation's occurrences in the window"
    )


class LabSpend(CalqueModel):
    """A lab's month-to-date use against its budget (``calque report budgets``, the checkout gate)."""

    lab: str
    month: str = Field(description="YYYY-MM (UTC)")
    gpu_hours: float
    ec2_usd: float
    unit: str | None = Field(None, description="the budget's unit; None: no budget")
    limit: float | None = None
    extra: float = Field(0.0, description="audited overrides granted this month, in the budget's unit")
    used: float | None = Field(None, description="the share of budget + extra used (1.0 = all of it)")
    state: Literal["unlimited", "ok", "notice", "over"] = "unlimited"
    raised_by: str | None = None
