"""The Acquirer: the only code in calque that launches or terminates EC2 instances (Layer 0).

``plan`` says what acquiring a ``CohortSpec`` would do (check mode); ``apply`` does it behind the
spend gate and the quota preflight, sweeping capacity over types and subnets; ``release`` ends a
cohort. Clients come from ``calque.aws.clients.client`` unless the caller passes its own (an
Ansible module passes amazon.aws's; a test or benchmark may pass a client with event hooks
registered on it). That is the one extension point; nothing here knows about tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from calque.aws import pricing
from calque.aws.acquire import cohort as cohort_ops
from calque.aws.acquire.launch_spec import (
    build_user_data,
    cohort_tags,
    expires_at,
    resolve_image,
    run_instances_params,
)
from calque.aws.acquire.quota import preflight
from calque.aws.acquire.spend_gate import (
    Consent,
    check_spend_limit,
    price_cohort,
    require_spend_consent,
    require_terminate_consent,
)
from calque.aws.acquire.sweep import Candidate, candidates, sweep
from calque.aws.aws_errors import translate
from calque.aws.clients import client
from calque.errors import InfrastructureError, UsageError
from calque.models.acquire import CohortPlan, CohortResult, CohortSpec, Lifecycle

Progress = Callable[[str], None]

_MARKETS: dict[str, list[Lifecycle]] = {
    "on-demand": ["on-demand"],
    "spot": ["spot"],
    "spot-then-on-demand": ["spot", "on-demand"],
}


class Acquirer:
    """Acquire, resize and release cohorts of EC2 instances."""

    def __init__(
        self,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        ec2: Any = None,
        ssm: Any = None,
        service_quotas: Any = None,
        progress: Progress | None = None,
        max_parallel: int = 8,
        waiter_delay_s: int = 5,
    ) -> None:
        self._region, self._endpoint_url, self._profile = region, endpoint_url, profile
        self._ec2, self._ssm, self._quotas = ec2, ssm, service_quotas
        self._say: Progress = progress or (lambda _msg: None)
        self.max_parallel = max_parallel
        self.waiter_delay_s = waiter_delay_s

    # Clients are made on first use so that a plan never opens an SSM or Service Quotas client.
    @property
    def ec2(self) -> Any:
        if self._ec2 is None:
            self._ec2 = self._client("ec2")
        return self._ec2

    @property
    def ssm(self) -> Any:
        if self._ssm is None:
            self._ssm = self._client("ssm")
        return self._ssm

    @property
    def service_quotas(self) -> Any:
        if self._quotas is None:
            self._quotas = self._client("service-quotas")
        return self._quotas

    def _client(self, service: str) -> Any:
        return client(service, region=self._region, endpoint_url=self._endpoint_url, profile=self._profile)

    # --- reading --------------------------------------------------------------------------------

    def status(self, name: str) -> CohortResult:
        """The cohort's live instances, changing nothing."""
        return self._result(name, changed=False)

    def plan(self, spec: CohortSpec) -> CohortPlan:
        """What ``apply(spec)`` would launch or terminate, and the spend arithmetic; changes nothing.

        Raises RefusedError when the cohort would cost more than ``spec.max_hourly_usd``.
        """
        live = cohort_ops.describe_cohort(self.ec2, spec.name)
        spend = price_cohort(spec.count, spec.instance_types, spec.max_hourly_usd)
        check_spend_limit(spend)
        return CohortPlan(
            name=spec.name,
            current=len(live),
            target=spec.count,
            launch=max(0, spec.count - len(live)),
            terminate=cohort_ops.newest_first(live, len(live) - spec.count),
            spend=spend,
        )

    # --- changing -------------------------------------------------------------------------------

    def apply(self, spec: CohortSpec, consent: Consent) -> CohortResult:
        """Bring the cohort to ``spec.count`` instances: launch the difference or end the newest."""
        plan = self.plan(spec)
        if plan.terminate:
            require_terminate_consent(consent, plan.terminate)
            self._say(f"terminating {len(plan.terminate)} instance(s) of cohort {spec.name}, newest first")
            ended = cohort_ops.terminate(self.ec2, spec.name, plan.terminate)
            return self._result(spec.name, changed=bool(ended), terminated=ended, requested=spec.count)
        if plan.launch == 0:
            return self._result(spec.name, changed=False, requested=spec.count)
        require_spend_consent(consent, plan.launch, plan.spend)
        return self._launch(spec, plan)

    def release(self, name: str, consent: Consent, *, wait: bool = False, wait_timeout_s: int = 600) -> CohortResult:
        """Terminate every instance of cohort ``name`` (and only those)."""
        ids = [i["InstanceId"] for i in cohort_ops.describe_cohort(self.ec2, name)]
        if not ids:
            return self._result(name, changed=False)
        require_terminate_consent(consent, ids)
        self._say(f"terminating cohort {name}: {len(ids)} instance(s)")
        ended = cohort_ops.terminate(self.ec2, name, ids)
        if wait:
            cohort_ops.wait_for(self.ec2, "instance_terminated", ended, wait_timeout_s, self.waiter_delay_s)
        return self._result(name, changed=bool(ended), terminated=ended)

    # --- internals ------------------------------------------------------------------------------

    def _launch(self, spec: CohortSpec, plan: CohortPlan) -> CohortResult:
        markets = _MARKETS[spec.market]
        need, viable_need = plan.launch, max(0, spec.viable - plan.current)
        quota = preflight(
            self.ec2,
            self.service_quotas,
            markets=markets,
            instance_types=spec.instance_types,
            need=need,
            viable_need=viable_need,
        )
        for w in quota.warnings:
            self._say(f"warning: {w}")
        image_id, root_device = resolve_image(self.ec2, self.ssm, spec)
        expires = expires_at(spec.ttl_seconds)
        tags = cohort_tags(spec, expires)
        user_data = build_user_data(expires, spec.user_data)
        cands = [
            c
            for c in candidates(markets, spec.instance_types, spec.subnets)
            if (c.market, c.instance_type) not in quota.blocked_types
        ]

        def launch(cand: Candidate, count: int) -> list[dict[str, Any]]:
            params = run_instances_params(
                spec,
                image_id=image_id,
                root_device=root_device,
                instance_type=cand.instance_type,
                subnet_id=cand.subnet_id,
                market=cand.market,
                count=count,
                tags=tags,
                user_data=user_data,
            )
            return list(self.ec2.run_instances(**params)["Instances"])

        self._say(f"cohort {spec.name}: {plan.current} live, launching {need} (at least {viable_need})")
        out = sweep(launch, cands, need, max_parallel=self.max_parallel, progress=self._say)
        new_ids = [i["InstanceId"] for i in out.instances]
        tried = "; ".join(
            f"{a.market} {a.instance_type}@{a.subnet_id or 'default'}: {a.launched}/{a.requested}"
            + (f" {a.error_code}" if a.error_code else "")
            for a in out.attempts
        )
        failure: Exception | None = None
        if out.fatal is not None:
            failure = translate(out.fatal, f"launch cohort {spec.name}")
        elif out.launched < viable_need:
            failure = InfrastructureError(
                f"cohort {spec.name}: launched {out.launched} of {need} but needs at least {viable_need} more "
                f"(min_viable {spec.viable}, {plan.current} already live); no capacity left among "
                f"{', '.join(spec.instance_types)} in {len(spec.subnets) or 1} subnet(s) [{tried}]. "
                "Add instance types or subnets, try spot-then-on-demand, or lower min_viable."
            )
        if failure is None and spec.wait:
            try:
                cohort_ops.wait_for(self.ec2, "instance_running", new_ids, spec.wait_timeout_s, self.waiter_delay_s)
            except InfrastructureError as exc:
                failure = exc
        if failure is not None:
            if spec.cleanup_on_failure and new_ids:
                self._say(f"cleaning up {len(new_ids)} instance(s) this failed attempt launched")
                cohort_ops.terminate(self.ec2, spec.name, new_ids)
                failure.args = (f"{failure.args[0]} (terminated the {len(new_ids)} launched by this attempt)",)
            elif new_ids:
                failure.args = (f"{failure.args[0]} (left running: {', '.join(new_ids)})",)
            raise failure
        warnings = list(quota.warnings)
        shortfall = need - out.launched
        if shortfall > 0:
            warnings.append(f"launched {out.launched} of {need}: {shortfall} short of count [{tried}]")
        return self._result(
            spec.name,
            changed=bool(new_ids),
            launched=new_ids,
            requested=spec.count,
            attempts=out.attempts,
            warnings=warnings,
        )

    def _result(self, name: str, *, changed: bool, requested: int | None = None, **extra: Any) -> CohortResult:
        live = [cohort_ops.to_instance(i) for i in cohort_ops.describe_cohort(self.ec2, name)]
        want = len(live) if requested is None else requested
        return CohortResult(
            name=name,
            changed=changed,
            instances=live,
            requested=want,
            shortfall=max(0, want - len(live)),
            hourly_usd=round(sum(_rate_or_zero(i.instance_type) for i in live), 4),
            **extra,
        )


def _rate_or_zero(instance_type: str) -> float:
    try:
        return pricing.hourly_usd(instance_type)
    except UsageError:
        return 0.0
