"""A session-host class's scaling as an operation: out on the broker's unserved demand, in on idle hosts.

The parts and their rules are ``calque.aws.acquire.fleet_scaling``; reading, comparing and writing
them is ``PoolScaling``'s, as for a pool (a second run changes nothing; check mode is the same plan,
unapplied; a group or alarm tagged for another pool is refused). The group itself belongs to
``pool_group`` (pool ``fleet/<class>``): this plans without it and applies only once it exists.
``absent`` deletes the alarms, policies and drain hook and leaves the group.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from calque.aws.acquire.fleet_scaling import FleetScalingSettings, desired_fleet_scaling
from calque.aws.acquire.scaling import PoolScaling, ScalingState
from calque.models.base import CalqueModel
from calque.models.fleet import ClassName, fleet_pool
from calque.models.pool_names import pool_names
from calque.ops.base import validated
from calque.ops.scaling_op import ScalingOp, ScalingPlan


class FleetScalingRequest(CalqueModel):
    """The scaling asked for one class (the module's options)."""

    fleet_class: ClassName
    state: Literal["present", "absent"] = "present"
    slices_per_host: int = Field(1, description="slices one host offers: unserved requests per added host")
    boot_s: int = Field(420, description="a host's boot to registered with the broker")
    idle_s: int = Field(1200, description="seconds a host has no live session before it may go")
    drain_timeout_s: int = Field(7200, description="seconds a leaving host is held while it drains")
    max_step: int = Field(10, description="the most hosts one scale-out step adds")
    keep_drain_hook: bool = Field(False, description="absent: keep the drain hook while the group drains (teardown)")

    def settings(self) -> FleetScalingSettings:
        data = self.model_dump(include={"slices_per_host", "boot_s", "idle_s", "drain_timeout_s", "max_step"})
        return validated(FleetScalingSettings, data, f"invalid scaling for session class {self.fleet_class}")


class FleetScalingResult(CalqueModel):
    group_name: str
    policies: list[str] = Field(default_factory=list)
    alarms: list[str] = Field(default_factory=list)
    lifecycle_hooks: list[str] = Field(default_factory=list)
    steps: list[dict[str, float | int]] = Field(default_factory=list, description="the demand policy's steps")


FleetScalingPlan = ScalingPlan[FleetScalingRequest]


class FleetScalingOp(ScalingOp[FleetScalingRequest, FleetScalingResult]):
    name = "session_fleet_scaling"
    Request = FleetScalingRequest

    def plan(self, request: FleetScalingRequest) -> FleetScalingPlan:
        names = pool_names(fleet_pool(request.fleet_class))
        scaling = PoolScaling(self.aws.client("autoscaling"), self.aws.client("cloudwatch"), names)
        settings = request.settings() if request.state == "present" else FleetScalingSettings(slices_per_host=1)
        want = desired_fleet_scaling(names, request.fleet_class, settings)
        current = scaling.read(want)  # absent: read against a default plan, which names every part
        if request.state == "absent" and request.keep_drain_hook:
            current.hooks = {}  # the hook holds each leaving host while it drains; it goes with the group
        return FleetScalingPlan(request, scaling, current, want if request.state == "present" else None)

    def no_group_warning(self, plan: FleetScalingPlan) -> str:
        return f"no Auto Scaling group {plan.scaling.names.group} yet: the real run makes it first (pool_group)"

    def no_group_failure(self, plan: FleetScalingPlan) -> str:
        return (
            f"no Auto Scaling group {plan.scaling.names.group} for session class "
            f"{plan.request.fleet_class!r}: create it first (playbooks/session_fleet.yml), then its scaling"
        )

    def result_for(self, plan: FleetScalingPlan, after: ScalingState) -> FleetScalingResult:
        demand = next((p for n, p in after.policies.items() if n.endswith("-demand")), {})
        return FleetScalingResult(
            group_name=plan.scaling.names.group,
            policies=sorted(after.policies),
            alarms=sorted(after.alarms),
            lifecycle_hooks=sorted(after.hooks),
            steps=list(demand.get("StepAdjustments", [])),
        )
