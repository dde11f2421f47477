"""Scheduled warmth: Auto Scaling scheduled actions that raise a pool's minimum for a window (Layer 0).

A window (``calque_pool_schedule`` in inventory, or ``calque pool prewarm`` once) is two scheduled
actions on the pool's group: ``<name>-start`` sets MinSize to the window's instances ``lead``
before its time (a class at 10:00 gets its instances at 09:50), ``<name>-end`` sets it back to the
pool's own minimum when the window ends. Recurring windows are cron in the entry's time zone;
AWS deletes a one-off action once it has run. Raising the minimum is inside the spend gate's worst
case (never above max_size), so the gate priced it already.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from calque.aws.acquire.group import describe_group
from calque.aws.aws_errors import aws_errors
from calque.aws.clients import client
from calque.errors import RefusedError, UsageError
from calque.models.pool_names import ForeignPoolError, pool_names
from calque.models.warmth import PrewarmReport, ScheduleEntry

RECURRING_PREFIX = "calque-sched-"
PREWARM_PREFIX = "calque-prewarm-"
_FIELDS = ("MinSize", "Recurrence", "TimeZone", "StartTime")


def _shift(at: str, minutes: int, what: str) -> str:
    """``at`` (cron) moved by ``minutes``; the minute and hour fields must be plain numbers."""
    minute, hour, *days = at.split()
    if not (minute.isdigit() and hour.isdigit()):
        raise UsageError(f"schedule at {at!r}: give the minute and hour as numbers (e.g. '0 10 * * 1-5')")
    total = int(hour) * 60 + int(minute) + minutes
    if not 0 <= total < 24 * 60 and days != ["*", "*", "*"]:
        raise UsageError(
            f"schedule at {at!r}: the window's {what} falls on another day; move the window or shorten its lead "
            "or duration (a window with day or weekday fields must start and end on its day)"
        )
    total %= 24 * 60
    return " ".join([str(total % 60), str(total // 60), *days])


def recurring_actions(entries: list[ScheduleEntry], base_min: int) -> dict[str, dict[str, Any]]:
    """Every scheduled action the entries ask for, by name, in the shape DescribeScheduledActions answers."""
    out: dict[str, dict[str, Any]] = {}
    for e in entries:
        start = _shift(e.at, -(e.lead_s // 60), "start (at minus lead)")
        end = _shift(e.at, e.duration_s // 60, "end (at plus duration)")
        common = {"TimeZone": e.timezone}
        out[f"{RECURRING_PREFIX}{e.name}-start"] = {"MinSize": e.instances, "Recurrence": start, **common}
        out[f"{RECURRING_PREFIX}{e.name}-end"] = {"MinSize": base_min, "Recurrence": end, **common}
    return out


def describe_actions(asg: Any, group: str, prefix: str = RECURRING_PREFIX) -> dict[str, dict[str, Any]]:
    """The group's scheduled actions whose names start with ``prefix``, only the fields calque sets."""
    with aws_errors(f"describe the scheduled actions of {group!r}"):
        found = asg.describe_scheduled_actions(AutoScalingGroupName=group).get("ScheduledUpdateGroupActions", [])
    return {
        a["ScheduledActionName"]: {k: a[k] for k in _FIELDS if a.get(k) is not None and k != "StartTime"}
        for a in found
        if a["ScheduledActionName"].startswith(prefix)
    }


def put_action(asg: Any, group: str, name: str, doc: dict[str, Any]) -> None:
    with aws_errors(f"put scheduled action {name} on {group!r}"):
        asg.put_scheduled_update_group_action(AutoScalingGroupName=group, ScheduledActionName=name, **doc)


def delete_action(asg: Any, group: str, name: str) -> None:
    with aws_errors(f"delete scheduled action {name} of {group!r}"):
        asg.delete_scheduled_action(AutoScalingGroupName=group, ScheduledActionName=name)


def prewarm_actions(
    at: datetime, duration_s: int, instances: int, lead_s: int, base_min: int, now: datetime
) -> dict[str, dict[str, Any]]:
    """The two one-off actions of ``calque pool prewarm``: named by the window's start (UTC)."""
    start, end = at - timedelta(seconds=lead_s), at + timedelta(seconds=duration_s)
    if end <= now:
        raise UsageError(f"the window {at.isoformat()} + {duration_s}s has already ended; give a later --at")
    start = max(start, now + timedelta(seconds=60))  # AWS refuses a start in the past
    stem = f"{PREWARM_PREFIX}{at.strftime('%Y%m%dT%H%MZ').lower()}"
    return {
        f"{stem}-start": {"MinSize": instances, "StartTime": start},
        f"{stem}-end": {"MinSize": base_min, "StartTime": end},
    }


def prewarm(asg: Any, ec2: Any, pool: str, at: datetime, duration_s: int, instances: int, lead_s: int) -> PrewarmReport:
    """``calque pool prewarm``: one window of ``instances`` in service, for the pool's own group only."""
    names = pool_names(pool)
    try:
        group = describe_group(asg, ec2, names.group, pool)
    except ForeignPoolError as exc:
        raise RefusedError(str(exc)) from None
    if group is None:
        raise UsageError(f"pool {pool} has no Auto Scaling group {names.group}: run playbooks/pool.yml first")
    if instances > group.max_size:
        raise UsageError(
            f"--instances {instances} is above the group's max_size {group.max_size} (the spend gate's worst case); "
            "raise calque_pool_group.max_size with pool.yml first"
        )
    actions = prewarm_actions(at, duration_s, instances, lead_s, group.min_size, datetime.now(timezone.utc))
    for name, doc in actions.items():
        put_action(asg, names.group, name, doc)
    shown = {k: {**v, "StartTime": v["StartTime"].isoformat()} for k, v in actions.items()}
    return PrewarmReport(pool=pool, group=names.group, actions=shown)


def prewarm_pool(
    pool: str,
    at: datetime,
    duration_s: int,
    instances: int,
    lead_s: int,
    *,
    region: str | None = None,
    endpoint_url: str | None = None,
    profile: str | None = None,
) -> PrewarmReport:
    """``calque pool prewarm`` in one account and region: :func:`prewarm` with its clients made here."""
    asg, ec2 = (client(s, region=region, endpoint_url=endpoint_url, profile=profile) for s in ("autoscaling", "ec2"))
    return prewarm(asg, ec2, pool, at, duration_s, instances, lead_s)
