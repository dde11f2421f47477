"""What the two scaling operations share (``pool_scaling``, ``session_fleet_scaling``): the plan (the
parts read from AWS against the parts wanted, ``None`` for absent), check mode's warning on a group not
made yet, the apply (nothing, remove, refuse without a group, ensure) and the Outcome's before/after.

Each operation says only how it plans, how its result carries the parts (``result_for``) and, in its
own words, what a missing group means (``no_group_warning``, ``no_group_failure``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from calque.aws.acquire.scaling import PoolScaling, ScalingState
from calque.models.base import CalqueModel
from calque.ops.base import Operation
from calque.ops.outcome import Failure, Outcome

Req = TypeVar("Req", bound=CalqueModel)
Res = TypeVar("Res", bound=BaseModel)


@dataclass
class ScalingPlan(Generic[Req]):
    request: Req
    scaling: PoolScaling
    current: ScalingState
    want: ScalingState | None  # None: absent
    target: int | None = None  # a pool's backlog per instance (a class has none)

    @property
    def changed(self) -> bool:
        return self.current.differs(self.want)

    def actions(self) -> list[str]:
        return self.current.actions_to(self.want)


class ScalingOp(Operation[Req, ScalingPlan[Req], Res], Generic[Req, Res]):
    def result_for(self, plan: ScalingPlan[Req], after: ScalingState) -> Res:
        raise NotImplementedError

    def no_group_warning(self, plan: ScalingPlan[Req]) -> str:
        raise NotImplementedError

    def no_group_failure(self, plan: ScalingPlan[Req]) -> str:
        raise NotImplementedError

    def check(self, plan: ScalingPlan[Req]) -> Outcome[Res]:
        outcome = self._outcome(plan, plan.actions(), check_mode=True)
        if plan.want is not None and not plan.current.group_exists:
            outcome.warnings.append(self.no_group_warning(plan))
        return outcome

    def apply(self, plan: ScalingPlan[Req]) -> Outcome[Res]:
        if not plan.changed:
            return self._outcome(plan, [], check_mode=False)
        if plan.want is None:
            return self._outcome(plan, plan.scaling.remove(plan.current), check_mode=False)
        if not plan.current.group_exists:
            outcome = self._outcome(plan, [], check_mode=False)
            outcome.changed = False
            outcome.failure = Failure(message=self.no_group_failure(plan))
            return outcome
        return self._outcome(plan, plan.scaling.ensure(plan.current, plan.want), check_mode=False)

    def _outcome(self, plan: ScalingPlan[Req], actions: list[str], *, check_mode: bool) -> Outcome[Res]:
        after = plan.want or ScalingState(group_exists=plan.current.group_exists)
        return Outcome[Any](  # the result's own model serializes it, as Outcome[PoolScalingResult] did
            resource=self.name,
            check_mode=check_mode,
            changed=plan.changed,
            before=plan.current.model_dump(exclude={"group_exists"}),
            after=after.model_dump(exclude={"group_exists"}),
            actions=actions,
            result=self.result_for(plan, after),
        )
