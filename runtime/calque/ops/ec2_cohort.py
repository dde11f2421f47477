"""A cohort of EC2 instances as an operation, through the Acquirer (the only code that launches or ends them).

``present`` brings the cohort to ``count`` instances (``Acquirer.plan``/``apply``); ``absent`` plans
the release of every instance of the cohort. Both plans have one shape (``CohortOpPlan``), so check
mode, diff and the real run report the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from calque.aws.acquire import Acquirer, Consent
from calque.aws.acquire.spend_gate import SPEND_FLAGS, TERMINATE_FLAGS
from calque.errors import UsageError
from calque.models.acquire import CohortInstance, CohortResult, CohortSpec, LaunchAttempt, LaunchOptions, Market
from calque.models.base import CalqueModel
from calque.ops.base import Operation, validated
from calque.ops.outcome import Outcome

# request option -> CohortSpec field, where they differ (the option names are the module's)
RENAMED = {"ttl_seconds": "ttl", "wait_timeout_s": "wait_timeout"}
_NOT_SPEC = ("state", "i_understand_this_spends_money", "i_understand_this_terminates_instances")


class CohortRequest(LaunchOptions):
    """A cohort as its caller names it (the module's options); ``spec()`` makes the Acquirer's CohortSpec."""

    name: str
    state: Literal["present", "absent"] = "present"
    count: int | None = None
    min_viable: int | None = None
    instance_types: list[str] | None = None
    subnets: list[str] = Field(default_factory=list)
    market: Market = "on-demand"
    spot_max_price: float | None = None
    user_data: str | None = None
    ttl: str = "3h"
    tags: dict[str, Any] = Field(default_factory=dict)
    pool: str | None = None
    owner: str | None = None
    max_hourly_usd: float | None = None
    i_understand_this_spends_money: bool = False
    i_understand_this_terminates_instances: bool = False
    cleanup_on_failure: bool = True
    wait: bool = True
    wait_timeout: int = 600

    def spec(self) -> CohortSpec:
        if self.count is None:
            raise UsageError(
                "count is required with state=present: give the number of instances the cohort should have"
            )
        back = {v: k for k, v in RENAMED.items()}
        data = {back.get(k, k): v for k, v in self.model_dump(exclude_none=True).items() if k not in _NOT_SPEC}
        data["tags"] = {str(k): str(v) for k, v in self.tags.items()}  # EC2 tags are strings
        return validated(CohortSpec, data, "invalid ec2_cohort options", RENAMED)

    def consent(self) -> Consent:
        return Consent(spend=self.i_understand_this_spends_money, terminate=self.i_understand_this_terminates_instances)


class PlanSummary(CalqueModel):
    current: int
    target: int
    launch: int
    terminate: list[str]
    spend: str = ""


class CohortOpResult(CalqueModel):
    """The cohort after the run (before it, in check mode) and what the run did."""

    instances: list[CohortInstance]
    hourly_usd: float
    launched: list[str] = Field(default_factory=list)
    terminated: list[str] = Field(default_factory=list)
    shortfall: int = 0
    plan: PlanSummary
    attempts: list[LaunchAttempt] = Field(default_factory=list)


@dataclass
class CohortOpPlan:
    request: CohortRequest
    acquirer: Acquirer
    before: CohortResult
    summary: PlanSummary
    spec: CohortSpec | None  # None: release the whole cohort
    hourly_usd: float
    warnings: list[str] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        return self.summary.launch > 0 or bool(self.summary.terminate)


def _ids(instances: list[CohortInstance]) -> list[str]:
    return [i.instance_id for i in instances]


class CohortOp(Operation[CohortRequest, CohortOpPlan, CohortOpResult]):
    name = "ec2_cohort"
    Request = CohortRequest

    def acquirer(self) -> Acquirer:
        aws = self.aws
        return Acquirer(
            ec2=aws.client("ec2"), ssm=aws.client("ssm"), service_quotas=aws.client("service-quotas"), progress=self.say
        )

    def plan(self, request: CohortRequest) -> CohortOpPlan:
        spec = request.spec() if request.state == "present" else None
        acquirer = self.acquirer()
        before = acquirer.status(request.name)
        consent = request.consent()
        if spec is None:
            ids = _ids(before.instances)
            summary = PlanSummary(current=len(ids), target=0, launch=0, terminate=ids)
            plan = CohortOpPlan(request, acquirer, before, summary, None, 0.0)
        else:
            p = acquirer.plan(spec)
            summary = PlanSummary(
                current=p.current, target=p.target, launch=p.launch, terminate=p.terminate, spend=p.spend.sentence()
            )
            plan = CohortOpPlan(request, acquirer, before, summary, spec, p.spend.hourly_usd)
        if summary.launch and not consent.spend:
            plan.warnings.append(f"the real run will be refused: pass {SPEND_FLAGS}")
        if summary.terminate and not consent.terminate:
            plan.warnings.append(f"the real run will be refused: pass {TERMINATE_FLAGS}")
        return plan

    def check(self, plan: CohortOpPlan) -> Outcome[CohortOpResult]:
        s = plan.summary
        after_ids = [i for i in _ids(plan.before.instances) if i not in s.terminate]
        result = CohortOpResult(instances=plan.before.instances, hourly_usd=plan.hourly_usd, plan=s)
        return self._outcome(plan, result, {"count": s.target, "instances": after_ids}, True, plan.warnings)

    def apply(self, plan: CohortOpPlan) -> Outcome[CohortOpResult]:
        r = plan.request
        if plan.spec is None:
            if not plan.changes:
                done = plan.before
            else:
                done = plan.acquirer.release(r.name, r.consent(), wait=r.wait, wait_timeout_s=r.wait_timeout)
        else:
            done = plan.acquirer.apply(plan.spec, r.consent())
        result = CohortOpResult(
            instances=done.instances,
            hourly_usd=done.hourly_usd if plan.spec is not None else 0.0,
            launched=done.launched,
            terminated=done.terminated,
            shortfall=done.shortfall,
            plan=plan.summary,
            attempts=done.attempts,
        )
        after = {"count": len(done.instances), "instances": _ids(done.instances)}
        return self._outcome(plan, result, after, False, done.warnings, changed=done.changed)

    def _outcome(
        self,
        plan: CohortOpPlan,
        result: CohortOpResult,
        after: dict[str, Any],
        check_mode: bool,
        warnings: list[str],
        changed: bool | None = None,
    ) -> Outcome[CohortOpResult]:
        s, name = plan.summary, plan.request.name
        actions = [f"launch {s.launch} instance(s) in cohort {name} ({s.spend})"] if s.launch else []
        actions += [f"terminate {', '.join(s.terminate)} of cohort {name}"] if s.terminate else []
        before_ids = _ids(plan.before.instances)
        return Outcome[CohortOpResult](
            resource=self.name,
            check_mode=check_mode,
            changed=plan.changes if changed is None else changed,
            before={"count": len(before_ids), "instances": before_ids},
            after=after,
            actions=actions,
            warnings=list(warnings),
            result=result,
        )
