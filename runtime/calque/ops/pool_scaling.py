"""A pool's scaling as an operation: backlog target tracking, out of and down to zero, the drain hook.

The parts and the target's formula are in ``calque.aws.acquire.scaling``. The group itself (its
launch template, min and max) belongs to ``pool_group``: this operation refuses a group tagged for
another pool, plans everything (check mode) even when the group does not exist yet, and applies only
to a group that does. ``absent`` deletes the alarms, policies and hook and leaves the group.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from calque.aws.acquire.scaling import PoolScaling, ScalingSettings, ScalingState, desired_scaling
from calque.models.base import CalqueModel, PoolName
from calque.models.pool_names import pool_names
from calque.ops.base import validated
from calque.ops.scaling_op import ScalingOp, ScalingPlan


class PoolScalingRequest(CalqueModel):
    """The scaling asked for a named pool; ``seconds_per_claim`` and ``latency_s`` when present."""

    pool: PoolName = Field(description="the pool's name, e.g. lab-a/embedder")
    state: Literal["present", "absent"] = "present"
    seconds_per_claim: float | None = Field(None, description="measured seconds one claim takes on this pool")
    latency_s: float | None = Field(None, description="how long a claim may wait for a worker")
    idle_s: int = Field(900, description="seconds with nothing to do before the group scales to zero")
    warmup_s: int = Field(300, description="seconds a new instance needs before it counts (boot and @enter)")
    drain_timeout_s: int = Field(300, description="seconds a terminating instance waits for its worker to drain")
    buffer: int = Field(0, description="instances kept beyond the backlog's need while active (buffer_containers)")

    @model_validator(mode="after")
    def _sized_when_present(self) -> PoolScalingRequest:
        if self.state == "present" and (self.seconds_per_claim is None or self.latency_s is None):
            raise ValueError(
                "state=present needs seconds_per_claim (measured: the claim_seconds of this pool's Summaries) "
                "and latency_s (how long a claim may wait): the backlog target is latency_s / seconds_per_claim"
            )
        return self

    def settings(self) -> ScalingSettings:
        fields = {"seconds_per_claim", "latency_s", "idle_s", "warmup_s", "drain_timeout_s", "buffer"}
        data = self.model_dump(include=fields)
        return validated(ScalingSettings, data, f"invalid scaling for pool {self.pool}")


class PoolScalingResult(CalqueModel):
    """The pool's scaling after the run (as it would be, in check mode)."""

    group_name: str
    target_backlog_per_instance: int | None = None
    policies: list[str] = Field(default_factory=list)
    alarms: list[str] = Field(default_factory=list)
    lifecycle_hooks: list[str] = Field(default_factory=list)


PoolScalingPlan = ScalingPlan[PoolScalingRequest]


class PoolScalingOp(ScalingOp[PoolScalingRequest, PoolScalingResult]):
    name = "pool_scaling"
    Request = PoolScalingRequest

    def plan(self, request: PoolScalingRequest) -> PoolScalingPlan:
        names = pool_names(request.pool)
        settings = request.settings() if request.state == "present" else None
        scaling = PoolScaling(self.aws.client("autoscaling"), self.aws.client("cloudwatch"), names)
        if settings is None:
            # absent: read against the shape of a default plan, which names every part calque makes
            like = desired_scaling(names, ScalingSettings(seconds_per_claim=1, latency_s=1))
            return PoolScalingPlan(request, scaling, scaling.read(like), None, None)
        want = desired_scaling(names, settings)
        return PoolScalingPlan(request, scaling, scaling.read(want), want, settings.target)

    def no_group_warning(self, plan: PoolScalingPlan) -> str:
        return (
            f"no Auto Scaling group {plan.scaling.names.group} yet: the real run needs it "
            "(calque.gpu.pool_group creates it first)"
        )

    def no_group_failure(self, plan: PoolScalingPlan) -> str:
        return (
            f"no Auto Scaling group {plan.scaling.names.group} for pool {plan.request.pool!r}: "
            "create it first (calque.gpu.pool_group, playbooks/pool.yml), then set its scaling"
        )

    def result_for(self, plan: PoolScalingPlan, after: ScalingState) -> PoolScalingResult:
        return PoolScalingResult(
            group_name=plan.scaling.names.group,
            target_backlog_per_instance=plan.target,
            policies=sorted(after.policies),
            alarms=sorted(after.alarms),
            lifecycle_hooks=sorted(after.hooks),
        )
