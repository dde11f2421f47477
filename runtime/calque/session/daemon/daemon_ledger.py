"""This host's part of the ledger: its sessions as priced usage events (``ledger`` op: a user's own,
every user's for root, the admin group and the institution's broker), its labs' month-to-date use
against their budgets (the checkout and extend gates: this host's sessions plus what the broker last
said the lab used on the other hosts and in its pools, ``budget_elsewhere``), and an admin's audited
override.

Each session is read from the usage table (ended) and the sessions table (live, up to now), weighted
by its slice's share of the GPU. A user's lab is the institution's lab naming one of their Unix
groups now (``institution.yaml``'s labs, from ``calque_labs``).
"""

from __future__ import annotations

import socket
import time
from datetime import datetime, timezone

from calque.errors import CalqueError
from calque.ledger.budgets import budget_state, month_of, month_start, refusal
from calque.ledger.events import SessionSpan, Window, session_event, slice_fraction
from calque.ledger.prices import ec2_usd_per_gpu_hour
from calque.models.institution import Institution, Lab
from calque.models.ledger import HostLedger, LabSpend, UsageEvent
from calque.models.session import BudgetElsewhereArgs
from calque.session.daemon.host import Host
from calque.session.daemon.identity import Caller
from calque.session.daemon.wire import RequestError
from calque.session.institution import load_institution
from calque.session.unix_groups import groups_of
from calque.timefmt import utc_moment

_SPANS = """
SELECT u.uid, u.user, u.kind, u.profile, u.gpu, u.started_at, u.ended_at,
       s.gid, json_extract(s.slice_json, '$.active_thread_percentage') AS atp, l.lab AS billed
FROM usage u LEFT JOIN sessions s ON s.id = u.session_id LEFT JOIN session_labs l ON l.session_id = u.session_id
WHERE u.ended_at >= :since AND u.started_at <= :until{mine_u}
UNION ALL
SELECT uid, user, json_extract(slice_json, '$.kind'), json_extract(slice_json, '$.profile'),
       json_extract(slice_json, '$.gpu_index'), created_at, :until, gid,
       json_extract(slice_json, '$.active_thread_percentage'), l.lab
FROM sessions LEFT JOIN session_labs l ON l.session_id = sessions.id
WHERE ended_at IS NULL AND created_at <= :until{mine}
"""


def host_name(host: Host) -> str:
    return host.config.host_name or socket.gethostname()


_INSTITUTION: dict[str, tuple[tuple[int, int], Institution]] = {}


def institution(host: Host) -> Institution:
    """``institution.yaml`` as it is now (parsed again only when the file changes: every checkout reads it)."""
    path = host.config.institution
    try:
        st = path.stat()
    except OSError:
        return Institution()
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _INSTITUTION.get(str(path))
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        inst = load_institution(path)
    except CalqueError:
        inst = Institution()  # a broken file is the listener's and the broker's to report; no labs here
    _INSTITUTION[str(path)] = (stamp, inst)
    return inst


def _cards(host: Host) -> dict[int, str | None]:
    if host.reader is None:
        return {}
    return {g.index: g.card or g.name for g in host.reader.gpus()}


def host_events(host: Host, since: float, until: float, uid: int | None = None) -> list[UsageEvent]:
    """This host's sessions overlapping [since, until] as usage events (``uid``'s only, when given)."""
    inst = institution(host)
    cards = _cards(host)
    labs: dict[tuple[str, int], str | None] = {}
    mine = "" if uid is None else " AND uid=:uid"
    sql = _SPANS.format(mine_u=mine.replace("uid", "u.uid", 1), mine=mine)
    rows = host.registry.query(sql, {"since": since, "until": until, "uid": uid})
    window = Window(since, until)
    out: list[UsageEvent] = []
    name = host_name(host)
    for r in rows:
        gid = r["gid"] if r["gid"] is not None else -1
        key = (r["user"], gid)
        if key not in labs:  # a session from before labs were recorded: the default rule, by its groups now
            lab = inst.lab_of(groups_of(r["user"], gid)) if inst.labs else None
            labs[key] = lab.name if lab else None
        card = cards.get(r["gpu"])
        span = SessionSpan(
            host=name,
            user=r["user"],
            lab=r["billed"] or labs[key],
            kind=r["kind"],
            profile=r["profile"],
            card=card,
            gpu_fraction=slice_fraction(card, r["kind"], r["profile"], r["atp"]),
            started=r["started_at"],
            ended=r["ended_at"],
        )
        e = session_event(span, window)
        if e is not None:
            out.append(e)
    return out


def host_ledger(host: Host, since: float, until: float, uid: int | None = None) -> HostLedger:
    """The events of [since, until] (``uid``'s only, when given) and every budgeted lab's month here."""
    labs = [lab for lab in institution(host).labs if lab.budget is not None]
    return HostLedger(
        host=host_name(host),
        taken_at=datetime.now(timezone.utc),
        since=utc_moment(since),
        until=utc_moment(until),
        events=host_events(host, since, until, uid),
        budgets=[spend_of(host, lab, until) for lab in labs],  # as the checkout gate sees them
    )


def sees_all(host: Host, c: Caller) -> bool:
    """Whether ``c`` reads every user's usage here: root, the admin group, or the institution's broker."""
    broker = institution(host).broker
    return c.admin or (broker is not None and c.user == broker.service_user)


def elsewhere(host: Host, c: Caller, args: BudgetElsewhereArgs) -> dict[str, int]:
    """The broker's sum of each lab's month on the other hosts, kept for the checkout gate."""
    if not sees_all(host, c):
        raise RequestError("forbidden", "only the institution's broker (or root) tells a host what labs used elsewhere")
    now = time.time()
    sql = "INSERT OR REPLACE INTO budget_elsewhere(lab, month, gpu_hours, usd, at) VALUES (?,?,?,?,?)"
    for lab, use in args.labs.items():
        host.registry.execute(sql, (lab, args.month, use.gpu_hours, use.usd, now))
    return {"labs": len(args.labs)}


def _elsewhere(host: Host, lab: str, month: str) -> tuple[float, float]:
    sql = "SELECT gpu_hours, usd FROM budget_elsewhere WHERE lab=? AND month=?"
    rows = host.registry.query(sql, (lab, month))
    return (float(rows[0]["gpu_hours"]), float(rows[0]["usd"])) if rows else (0.0, 0.0)


def overrides(host: Host, lab: str, month: str) -> float:
    rows = host.registry.query(
        "SELECT COALESCE(SUM(extra), 0.0) AS extra FROM budget_overrides WHERE lab=? AND month=?", (lab, month)
    )
    return float(rows[0]["extra"])


_ENDED = """
SELECT u.user, s.gid, u.kind, u.profile, u.gpu, json_extract(s.slice_json, '$.active_thread_percentage') AS atp,
       SUM(MAX(0.0, MIN(u.ended_at, :until) - MAX(u.started_at, :since))) AS seconds
FROM usage u LEFT JOIN sessions s ON s.id = u.session_id
WHERE u.ended_at >= :lo AND u.ended_at < :hi GROUP BY 1, 2, 3, 4, 5, 6
"""
_LIVE = """
SELECT user, gid, json_extract(slice_json, '$.kind') AS kind, json_extract(slice_json, '$.profile') AS profile,
       json_extract(slice_json, '$.gpu_index') AS gpu, json_extract(slice_json, '$.active_thread_percentage') AS atp,
       SUM(MAX(0.0, :until - MAX(created_at, :since))) AS seconds
FROM sessions WHERE ended_at IS NULL AND created_at <= :until GROUP BY 1, 2, 3, 4, 5, 6
"""
# A lab's month up to the start of this hour, per (registry, lab, hour): usage rows are written once,
# at a session's end, so the sessions that ended before the hour began never change.
_BEFORE_HOUR: dict[tuple[str, str, float], tuple[float, float]] = {}


def _sum(host: Host, lab: Lab, sql: str, params: dict[str, float]) -> tuple[float, float]:
    """GPU-seconds and EC2 dollars of ``lab``'s members in the grouped rows of ``sql``."""
    inst, cards = institution(host), _cards(host)
    gpu_s = usd = 0.0
    members: dict[tuple[str, int], bool] = {}
    for r in host.registry.query(sql, params):
        key = (r["user"], r["gid"] if r["gid"] is not None else -1)
        if key not in members:
            found = inst.lab_of(groups_of(*key))
            members[key] = found is not None and found.name == lab.name
        if not members[key]:
            continue
        card = cards.get(r["gpu"])
        g = (r["seconds"] or 0.0) * slice_fraction(card, r["kind"], r["profile"], r["atp"])
        gpu_s += g
        usd += (ec2_usd_per_gpu_hour(card) or 0.0) * g / 3600.0
    return gpu_s, usd


def spend_of(host: Host, lab: Lab, now: float | None = None, *, with_elsewhere: bool = True) -> LabSpend:
    """``lab``'s use on this host this month, with this month's overrides. What ended before this
    hour is summed once an hour (a user's lab is read then); the last hour's ends and the live
    sessions at every call, found through ``usage_ended_at``: a checkout pays for an hour, not a month."""
    t = now if now is not None else time.time()
    start = month_start(utc_moment(t)).timestamp()
    hour = max(start, t - t % 3600 - 60.0)  # a minute's margin: an end written just after its time still counts
    key = (str(host.config.db), lab.name, hour)
    before = _BEFORE_HOUR.get(key)
    if before is None:
        before = _sum(host, lab, _ENDED, {"since": start, "until": hour, "lo": start, "hi": hour})
        for old in [k for k in _BEFORE_HOUR if k[:2] == key[:2]]:
            del _BEFORE_HOUR[old]
        _BEFORE_HOUR[key] = before
    recent = _sum(host, lab, _ENDED, {"since": start, "until": t, "lo": hour, "hi": t + 1.0})
    live = _sum(host, lab, _LIVE, {"since": start, "until": t})
    gpu_s, usd = before[0] + recent[0] + live[0], before[1] + recent[1] + live[1]
    month = month_of(utc_moment(t))
    if with_elsewhere:  # the institution's other hosts, as the broker last summed them
        other_h, other_usd = _elsewhere(host, lab.name, month)
        gpu_s, usd = gpu_s + other_h * 3600.0, usd + other_usd
    return budget_state(lab, gpu_s / 3600.0, usd, utc_moment(t), overrides(host, lab.name, month))


def billed_lab(host: Host, c: Caller, asked: str | None) -> Lab | None:
    """The lab a checkout is billed to: ``--lab`` when the caller is in one of its groups, else the
    first lab of institution.yaml naming one of their groups (the broker's rule too); None: no labs."""
    inst = institution(host)
    if asked is None or not inst.labs:  # a host with no labs in its institution.yaml bills none
        return inst.lab_of(c.groups) if inst.labs else None
    lab = inst.lab(asked)
    if lab is None:
        raise RequestError("usage", f"no lab {asked} in institution.yaml; labs: {', '.join(x.name for x in inst.labs)}")
    if not set(lab.groups) & c.groups:
        mine = [x.name for x in inst.labs if set(x.groups) & c.groups]
        yours = ", ".join(mine) or "none"
        raise RequestError("refused", f"you are in none of lab {asked}'s groups (--lab); your labs: {yours}")
    return lab


def record_lab(host: Host, session_id: str, lab: Lab | None) -> None:
    if lab is not None:
        sql = "INSERT OR IGNORE INTO session_labs(session_id, lab) VALUES (?,?)"
        host.registry.execute(sql, (session_id, lab.name))


def session_lab(host: Host, session_id: str, c: Caller) -> Lab | None:
    """The lab a live session is billed to: as recorded at its checkout, else the default rule."""
    rows = host.registry.query("SELECT lab FROM session_labs WHERE session_id=?", (session_id,))
    recorded = institution(host).lab(rows[0]["lab"]) if rows else None
    return recorded if recorded is not None else billed_lab(host, c, None)


def budget_gate(host: Host, c: Caller, request_id: str | None, lab: Lab | None) -> None:
    """Refuse a checkout (or an extension: ``request_id`` None) billed to a lab that has spent its
    month's budget (``refused``: exit 4), with one sentence for both. A retried checkout (its id
    already has a session) is answered with it, as without a budget."""
    if lab is None or lab.budget is None:
        return
    retried = "SELECT 1 FROM sessions WHERE uid=? AND request_id=?"
    if request_id is not None and host.registry.query(retried, (c.uid, request_id)):
        return
    spend = spend_of(host, lab)
    if spend.state == "over":
        raise RequestError("refused", refusal(spend))


def override(host: Host, c: Caller, lab_name: str, extra: float, reason: str) -> LabSpend:
    """An admin's extra allowance for ``lab_name`` this month: written, audited, the new state returned."""
    if not c.admin:
        raise RequestError("forbidden", "only root or the admin group may override a lab's budget")
    lab = institution(host).lab(lab_name)
    if lab is None or lab.budget is None:
        raise RequestError("not_found", f"no lab {lab_name!r} with a budget in institution.yaml")
    now = time.time()
    month = month_of(utc_moment(now))
    host.registry.execute(
        "INSERT INTO budget_overrides(lab, month, at, extra, by_uid, reason) VALUES (?,?,?,?,?,?)",
        (lab_name, month, now, extra, c.uid, reason),
    )
    unit = lab.budget.unit
    host.audit.event("budget_override", lab=lab_name, month=month, extra=extra, unit=unit, by_uid=c.uid, reason=reason)
    return spend_of(host, lab, now)
