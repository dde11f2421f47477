"""A pool's Auto Scaling group beside its backlog, read without pydantic (``calque pool status``'s start-up).

``PoolScaling`` (``calque.aws.acquire.scaling``) describes its group through ``describe_group`` too, and
refuses another pool's parts with ``refuse_other_pools``; ``ScalingStatus`` there is the model of
``ScalingStatusView`` (``--json``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from calque.aws.aws_errors import aws_errors
from calque.errors import RefusedError
from calque.models.pool_names import ForeignPoolError, PoolNames, refuse_foreign
from calque.models.pool_views import DepthView, ScalingStatusView


def refuse_other_pools(kind: str, name: str, tags: list[dict[str, str]], pool: str) -> None:
    """``refuse_foreign`` as the CLI's and the modules' refusal (exit 4), not a bare ValueError."""
    try:
        refuse_foreign(kind, name, tags, pool)
    except ForeignPoolError as exc:
        raise RefusedError(str(exc)) from None


def policy_names(names: PoolNames) -> tuple[str, str, str]:
    """(backlog, wake, idle): policy names are per account in some engines, so they carry the pool's base."""
    return f"{names.base}-backlog", f"{names.base}-wake", f"{names.base}-idle"


@dataclass
class GroupView:
    """What the scaling side reads of a group: its size and its pool tag."""

    name: str
    min_size: int
    max_size: int
    desired: int
    in_service: int
    tags: list[dict[str, str]]
    metrics: list[str]


def describe_group(asg: Any, names: PoolNames) -> GroupView | None:
    """The pool's group as it is now; None when there is none."""
    with aws_errors(f"describe Auto Scaling group {names.group}"):
        groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[names.group])
    found = groups.get("AutoScalingGroups", [])
    if not found:
        return None
    g = found[0]
    return GroupView(
        name=g["AutoScalingGroupName"],
        min_size=int(g["MinSize"]),
        max_size=int(g["MaxSize"]),
        desired=int(g["DesiredCapacity"]),
        in_service=sum(1 for i in g.get("Instances", []) if i.get("LifecycleState") == "InService"),
        tags=[{"Key": t["Key"], "Value": t["Value"]} for t in g.get("Tags", [])],
        metrics=sorted(m["Metric"] for m in g.get("EnabledMetrics", [])),
    )


@dataclass(frozen=True)
class GroupReading:
    """A pool's group and its backlog policy's target as read from AWS (``read_group``)."""

    names: PoolNames
    group: GroupView | None
    target: float | None


def read_group(asg: Any, names: PoolNames) -> GroupReading:
    """The group and its backlog policy's target, the two reads at once (``calque pool status`` waits on
    the slowest of its reads, not their sum); a group tagged for another pool is refused before its
    policy is looked at."""

    def policies() -> Any:
        with aws_errors(f"describe the scaling policies of {names.group}"):
            return asg.describe_policies(AutoScalingGroupName=names.group, PolicyNames=[policy_names(names)[0]])

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="calque-group") as pool:
        policy_read = pool.submit(policies)
        group = describe_group(asg, names)
        if group is None:
            return GroupReading(names, None, None)
        refuse_other_pools("Auto Scaling group", group.name, group.tags, names.pool)
        found = policy_read.result()
    target = next((p["TargetTrackingConfiguration"]["TargetValue"] for p in found["ScalingPolicies"]), None)
    return GroupReading(names, group, target)


def scaling_status(reading: GroupReading, depth: DepthView) -> ScalingStatusView:
    """The group's size beside the queue's backlog and the backlog policy's target."""
    names, group = reading.names, reading.group
    backlog = depth.visible + depth.in_flight
    if group is None:
        return ScalingStatusView(
            pool=names.pool, group_name=names.group, group_exists=False, backlog=backlog, queue=depth
        )
    return ScalingStatusView(
        pool=names.pool,
        group_name=group.name,
        group_exists=True,
        min_size=group.min_size,
        max_size=group.max_size,
        desired=group.desired,
        in_service=group.in_service,
        backlog=backlog,
        backlog_per_instance=round(backlog / group.in_service, 2) if group.in_service else None,
        target=reading.target,
        queue=depth,
    )
