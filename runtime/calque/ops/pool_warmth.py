"""The warmth part of the pool group operation: its warm pool, launching hook and scheduled windows.

``pool_group`` plans and applies these beside the group; here each part is compared field by field
with what AWS describes (only the fields calque sets), so a second run changes nothing and a change
of warm-pool settings is one PutWarmPool, never a new template version or a roll.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from calque.aws.acquire import schedule as sched
from calque.aws.acquire import warm_pool as wp
from calque.models.warmth import ScheduleEntry, WarmPoolSettings


def check_warm_request(warm: WarmPoolSettings | None, market: str, instance_types: list[str] | None) -> None:
    """AWS's conditions on a warm pool, as the request's validation errors (ValueError)."""
    if warm is None:
        return
    if market != "on-demand" or len(instance_types or []) != 1:
        raise ValueError(
            "a warm pool needs market: on-demand and exactly one instance type: AWS refuses PutWarmPool on a "
            "group with a mixed instances policy or Spot (set calque_pool_group.market and instance_types)"
        )
    itype = (instance_types or [""])[0]
    if warm.state == "Hibernated" and not wp.supports_hibernation(itype):
        raise ValueError(
            f"warm state Hibernated: {itype} cannot hibernate ({wp.HIBERNATION_SOURCE} lists no GPU family); "
            "use state: Stopped (the disk cache is kept, memory is not)"
        )


@dataclass
class WarmthPlan:
    group: str
    want_pool: dict[str, Any] | None = None
    have_pool: dict[str, Any] | None = None
    warm_instances: int = 0
    want_hook: dict[str, Any] | None = None
    have_hook: dict[str, Any] | None = None
    want_schedule: dict[str, dict[str, Any]] = field(default_factory=dict)
    have_schedule: dict[str, dict[str, Any]] = field(default_factory=dict)
    actions: list[str] = field(default_factory=list)

    @property
    def launches(self) -> bool:
        """The run adds warmed instances (each boots and bootstraps once, billed while it runs)."""
        want = (self.want_pool or {}).get("MinSize", 0)
        return bool(want > ((self.have_pool or {}).get("MinSize", 0)))

    def before(self) -> dict[str, Any]:
        return {"warm_pool": self.have_pool, "launch_hook": self.have_hook, "schedule": self.have_schedule}

    def after(self) -> dict[str, Any]:
        return {"warm_pool": self.want_pool, "launch_hook": self.want_hook, "schedule": self.want_schedule}


def plan_warmth(
    asg: Any,
    group: str,
    exists: bool,
    warm: WarmPoolSettings | None,
    schedule: list[ScheduleEntry],
    min_size: int,
    *,
    absent: bool = False,
) -> WarmthPlan:
    """What differs between the group's warmth now and what the request asks (absent: remove the warm pool)."""
    plan = WarmthPlan(group)
    if exists:
        plan.have_pool, plan.warm_instances = wp.describe_warm_pool(asg, group)
        plan.have_hook = wp.describe_launch_hook(asg, group)
        plan.have_schedule = sched.describe_actions(asg, group)
    if absent:
        if plan.have_pool is not None:
            plan.actions.append(f"delete the warm pool of {group} ({plan.warm_instances} warmed instance(s))")
        return plan
    if warm is not None:
        plan.want_pool, plan.want_hook = wp.warm_pool_doc(warm), wp.launch_hook_doc(warm)
    plan.want_schedule = sched.recurring_actions(schedule, min_size)
    if plan.want_hook != plan.have_hook:
        verb = "delete" if plan.want_hook is None else "put"
        plan.actions.append(f"{verb} lifecycle hook {wp.LAUNCH_HOOK} (autoscaling:EC2_INSTANCE_LAUNCHING)")
    if plan.want_pool != plan.have_pool:
        if plan.want_pool is None:
            plan.actions.append(f"delete the warm pool of {group} ({plan.warm_instances} warmed instance(s))")
        else:
            have = plan.have_pool or {}
            diff = ", ".join(f"{k} {have.get(k)} -> {v}" for k, v in plan.want_pool.items() if have.get(k) != v)
            plan.actions.append(f"{'update' if plan.have_pool else 'create'} the warm pool of {group}: {diff}")
    for name, doc in plan.want_schedule.items():
        if plan.have_schedule.get(name) != doc:
            plan.actions.append(f"put scheduled action {name}: {doc}")
    plan.actions += [f"delete scheduled action {n}" for n in plan.have_schedule if n not in plan.want_schedule]
    return plan


def apply_warmth(asg: Any, plan: WarmthPlan) -> None:
    """Write what ``plan`` found different: the hook before the warm pool, so no instance warms unhooked."""
    g = plan.group
    if plan.want_hook is not None and plan.want_hook != plan.have_hook:
        wp.put_launch_hook(asg, g, plan.want_hook)
    if plan.want_pool != plan.have_pool or (plan.want_pool is None and plan.have_pool is not None):
        if plan.want_pool is None:
            wp.delete_warm_pool(asg, g)
        else:
            wp.put_warm_pool(asg, g, plan.want_pool)
    if plan.want_hook is None and plan.have_hook is not None:
        wp.delete_launch_hook(asg, g)
    for name, doc in plan.want_schedule.items():
        if plan.have_schedule.get(name) != doc:
            sched.put_action(asg, g, name, doc)
    for name in plan.have_schedule:
        if name not in plan.want_schedule:
            sched.delete_action(asg, g, name)


def remove_warm_pool(asg: Any, plan: WarmthPlan) -> None:
    """Teardown: the warm pool first (its stopped instances hold no claims), then the group drains."""
    if plan.have_pool is not None:
        wp.delete_warm_pool(asg, plan.group)
