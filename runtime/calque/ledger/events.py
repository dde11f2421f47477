"""Usage events from what sessions and pools record, each priced at both rates (``prices.py``).

A session's slice is weighted by its share of the GPU: a MIG profile's compute slices over the card's
(1g.24gb of an RTX PRO 6000: 1/4; 1g.5gb of an A100-40GB: 1/7), an MPS slot by its active thread
percentage (50 %: 1/2). Times are clipped to the report's window, so a session across its start
counts only inside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from calque.gpu.catalog import load_catalog
from calque.ledger.prices import ec2_usd_per_gpu_hour, instance_card, instance_usd_per_hour, modal_usd_per_gpu_second
from calque.models.ledger import UsageEvent, UsageSource
from calque.timefmt import utc_moment


def slice_fraction(card: str | None, kind: str, profile: str, active_thread_percentage: int | None = None) -> float:
    """The share of its GPU a slice is; 1.0 where it cannot be told (an unknown card or profile)."""
    if kind == "mps":
        pct = active_thread_percentage or 100
        return max(1, min(100, pct)) / 100.0
    found = load_catalog().find_card(card) if card else None
    if found is None or not found.compute_slices:
        return 1.0
    p = next((q for q in found.profiles if q.name == profile), None)
    return 1.0 if p is None else p.compute_slices / found.compute_slices


def lab_of_pool(pool: str) -> str:
    """A pool is named by its lab: ``lab-a/embedder`` is lab-a's."""
    return pool.split("/", 1)[0]


@dataclass(frozen=True)
class Window:
    since: float
    until: float

    def clip(self, start: float, end: float) -> tuple[float, float] | None:
        a, b = max(start, self.since), min(end, self.until)
        return (a, b) if b > a else None


@dataclass(frozen=True)
class SessionSpan:
    """One session's hold, as a host's registry has it (live ones end at the window's end)."""

    host: str
    user: str
    lab: str | None
    kind: str
    profile: str
    card: str | None
    gpu_fraction: float
    started: float
    ended: float


def session_event(span: SessionSpan, window: Window) -> UsageEvent | None:
    clipped = window.clip(span.started, span.ended)
    if clipped is None:
        return None
    a, b = clipped
    gpu_s = (b - a) * span.gpu_fraction
    ec2 = ec2_usd_per_gpu_hour(span.card)
    modal = modal_usd_per_gpu_second(span.card)
    return UsageEvent(
        source="session",
        host=span.host,
        lab=span.lab,
        user=span.user,
        profile=span.profile,
        card=span.card,
        started_at=utc_moment(a),
        ended_at=utc_moment(b),
        seconds=b - a,
        gpu_fraction=span.gpu_fraction,
        gpu_seconds=gpu_s,
        ec2_usd=None if ec2 is None else ec2 * gpu_s / 3600.0,
        modal_usd=None if modal is None else modal * gpu_s,
    )


def pool_event(
    source: UsageSource,
    pool: str,
    instance_type: str,
    start: float,
    end: float,
    seconds: float,
    spot_usd_per_hour: float | None = None,
) -> UsageEvent:
    """``seconds`` of a pool instance (busy or warm-idle) between ``start`` and ``end``.

    EC2 charges every second an instance is up, at its type's rate (the spot price paid where known);
    Modal charges a busy second of each GPU and nothing for an idle one."""
    card, gpus = instance_card(instance_type)
    rate = instance_usd_per_hour(instance_type, spot_usd_per_hour)
    modal = modal_usd_per_gpu_second(card)
    gpu_s = seconds * gpus
    return UsageEvent(
        source=source,
        pool=pool,
        lab=lab_of_pool(pool),
        profile=instance_type,
        card=card,
        started_at=utc_moment(start),
        ended_at=utc_moment(end),
        seconds=seconds,
        gpu_fraction=float(gpus),
        gpu_seconds=gpu_s,
        ec2_usd=None if rate is None else rate * seconds / 3600.0,
        modal_usd=None if modal is None else (modal * gpu_s if source == "pool-busy" else 0.0),
    )
