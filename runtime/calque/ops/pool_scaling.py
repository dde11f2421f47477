"""A pool's scaling as an operation: backlog target tracking, out of and down to zero, the drain hook.

The parts and the target's formula are in ``calque.aws.acquire.scaling``. The group itself (its
launch template, min and max) belongs to ``pool_group``: this operation refuses a group tagged for
another pool, plans everything (check mode) even when the group does not exist yet, and applies only
to a group that does. ``absent`` deletes the alarms, policies and hook and leaves the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from calque.aws.acquire.scaling import PoolScaling, ScalingSettings, ScalingState, desired_scaling
from calque.models.base import CalqueModel, PoolName
from calque.models.pool_names import pool_names
from calque.ops.base import Operation, validated
from calque.ops.outcome import Failure, Outcome


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


@dataclass
class PoolScalingPlan:
    request: PoolScalingRequest
    scaling: PoolScaling
    current: ScalingState
    want: ScalingState | None  # None: absent
    target: int | None

    @property
    def changed(self) -> bool:
        return self.current.differs(self.want)

    def actions(self) -> list[str]:
        return self.current.actions_to(self.want)


class PoolScalingOp(Operation[PoolScalingRequest, PoolScalingPlan, PoolScalingResult]):
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

    def check(self, plan: PoolScalingPlan) -> Outcome[PoolScalingResult]:
        outcome = self._outcome(plan, plan.actions(), check_mode=True)
        if plan.want is not None and not plan.current.group_exists:
            outcome.warnings.append(
                f"no Auto Scaling group {plan.scaling.names.group} yet: the real run needs it "
                "(calque.gpu.pool_group creates it first)"
            )
        return outcome

    def apply(self, plan: PoolScalingPlan) -> Outcome[PoolScalingResult]:
        if not plan.changed:
            return self._outcome(plan, [], check_mode=False)
        if plan.want is None:
            return self._outcome(plan, plan.scaling.remove(plan.current), check_mode=False)
        if not plan.current.group_exists:
            outcome = self._outcome(plan, [], check_mode=False)
            outcome.changed = False
            outcome.failure = Failure(
                message=f"no Auto Scaling group {plan.scaling.names.group} for pool {plan.request.pool!r}: "
                "create it first (calque.gpu.pool_group, playbooks/pool.yml), then set its scaling"
            )
            return outcome
        return self._outcome(plan, plan.scaling.ensure(plan.current, plan.want), check_mode=False)

    def _outcome(self, plan: PoolScalingPlan, actions: list[str], *, check_mode: bool) -> Outcome[PoolScalingResult]:
        after = plan.want or ScalingState(group_exists=plan.current.group_exists)
        return Outcome[PoolScalingResult](
            resource=self.name,
            check_mode=check_mode,
            changed=plan.changed,
            before=plan.current.model_dump(exclude={"group_exists"}),
            after=after.model_dump(exclude={"group_exists"}),
            actions=actions,
            result=PoolScalingResult(
                group_name=plan.scaling.names.group,
                target_backlog_per_instance=plan.target,
                policies=sorted(after.policies),
                alarms=sorted(after.alarms),
                lifecycle_hooks=sorted(after.hooks),
            ),
        )
