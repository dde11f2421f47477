"""``calque report``'s rows: usage events summed by lab, user, pool or profile, with both prices and
their ratio; and its renderings (a table, CSV). A host's events taken from its last answer (it did not
answer now) mark every row they reach ``stale``: never dropped, never passed off as fresh."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from datetime import datetime

from calque.models.ledger import HostLedger, LedgerKey, LedgerReport, LedgerRow, SourceState, UsageEvent

CSV_FIELDS = ("key", "events", "gpu_hours", "ec2_usd", "modal_usd", "ratio", "unpriced_events", "stale")


def _key(e: UsageEvent, by: LedgerKey) -> str:
    value = {
        "lab": e.lab,
        "user": e.user,
        "pool": e.pool,
        "profile": e.profile,
        "host": e.host,
        "source": e.source,
    }[by]
    return value or "-"


def _row(key: str, events: list[tuple[UsageEvent, bool]]) -> LedgerRow:
    ec2 = sum(e.ec2_usd or 0.0 for e, _ in events)
    modal = sum(e.modal_usd or 0.0 for e, _ in events)
    return LedgerRow(
        key=key,
        events=len(events),
        gpu_hours=round(sum(e.gpu_seconds for e, _ in events) / 3600.0, 6),
        ec2_usd=round(ec2, 6),
        modal_usd=round(modal, 6),
        ratio=round(modal / ec2, 4) if ec2 > 0 else None,
        unpriced_events=sum(1 for e, _ in events if e.ec2_usd is None or e.modal_usd is None),
        stale=any(stale for _, stale in events),
    )


def build_report(
    by: LedgerKey,
    since: datetime,
    until: datetime,
    hosts: Iterable[HostLedger],
    pools: Iterable[tuple[str, datetime, list[UsageEvent]]] = (),
) -> LedgerReport:
    tagged: list[tuple[UsageEvent, bool]] = []
    sources: list[SourceState] = []
    for h in hosts:
        sources.append(SourceState(name=h.host, kind="host", taken_at=h.taken_at, stale=h.stale))
        tagged += [(e, h.stale) for e in h.events]
    for name, taken_at, events in pools:
        sources.append(SourceState(name=name, kind="pool", taken_at=taken_at))
        tagged += [(e, False) for e in events]
    groups: dict[str, list[tuple[UsageEvent, bool]]] = {}
    for e, stale in tagged:
        groups.setdefault(_key(e, by), []).append((e, stale))
    return LedgerReport(
        by=by,
        since=since,
        until=until,
        rows=[_row(k, groups[k]) for k in sorted(groups)],
        total=_row("total", tagged),
        sources=sources,
    )


def _money(x: float) -> str:
    return f"${x:,.2f}"


def render_table(r: LedgerReport) -> str:
    head = f"{r.by.upper():<24} {'GPU-HOURS':>10} {'EC2 $':>12} {'MODAL $':>12} {'MODAL/EC2':>9}"
    lines = [
        f"usage {r.since:%Y-%m-%d %H:%M}Z to {r.until:%Y-%m-%d %H:%M}Z by {r.by}",
        head,
    ]
    for row in [*r.rows, r.total]:
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}"
        mark = " (stale)" if row.stale else ""
        money = f"{_money(row.ec2_usd):>12} {_money(row.modal_usd):>12}"
        lines.append(f"{row.key:<24} {row.gpu_hours:>10.2f} {money} {ratio:>9}{mark}")
    for s in r.sources:
        if s.stale:
            lines.append(
                f"stale: {s.name} did not answer; its usage is from its last answer at {s.taken_at:%Y-%m-%d %H:%M:%S}Z"
            )
    for w in r.warnings:
        lines.append(f"disagreement: {w}")
    for c in r.reconciled:
        billed = (
            "nothing (is the calque:pool cost allocation tag activated?)"
            if c.billed_usd is None
            else _money(c.billed_usd)
        )
        mark = " (estimated)" if c.estimated else ""
        lines.append(
            f"reconcile {c.pool} {c.start} to {c.end}: ledger {_money(c.ledger_usd)} (instance-seconds at EC2 rates); "
            f"Cost Explorer {billed}{mark} (UnblendedCost, tag calque:pool)"
        )
    for o in r.reservations:  # the members' use is in the reserving lab's row above
        lines.append(
            f"reservation {o.name} ({o.lab}) {o.start:%Y-%m-%d %H:%M}Z: {o.reserved} x {o.profile} reserved, "
            f"{o.sessions} session(s) for {o.slice_hours:.2f} slice-hours, {o.handed_back} handed back"
        )
    if r.total.unpriced_events:
        lines.append(f"{r.total.unpriced_events} event(s) had no EC2 or no Modal price (counted in GPU-hours only)")
    return "\n".join(lines)


def render_csv(r: LedgerReport) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([r.by, *CSV_FIELDS[1:]])
    for row in [*r.rows, r.total]:
        d = row.model_dump()
        w.writerow(["" if d[f] is None else d[f] for f in CSV_FIELDS])
    return buf.getvalue()
