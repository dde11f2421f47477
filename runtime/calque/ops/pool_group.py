"""A pool's instances as an operation: its launch template and Auto Scaling group, through Layer 0.

``present`` makes or updates the template (a new version only when the config digest changes, or to
renew expiring presigned URLs), the group (MixedInstancesPolicy, spot price-capacity-optimized,
capacity rebalancing, MaxInstanceLifetime for TTLs of a day or more, the ``calque:usage`` tag) and
its size; replaces unhealthy instances; rolls older configs through an instance refresh. ``absent``
drains the group to zero, then deletes it and the template. The spend gate runs in ``plan``, before
the group is read or written: the worst case is ``max_size`` x the dearest type. ``gate_only`` stops
there (pool.yml's first task). Check mode validates AMI, profile, subnets, groups and a DryRun launch.
The request, the plan and the result are ``pool_group_models.py``'s.
"""

from __future__ import annotations

import time
from typing import Any

from calque.aws.acquire import group as grp
from calque.aws.acquire import template as tpl
from calque.aws.acquire.spend_gate import (
    SPEND_FLAGS,
    TERMINATE_FLAGS,
    check_spend_limit,
    price_cohort,
    require_terminate_consent,
)
from calque.aws.acquire.validate import check_launch_inputs
from calque.durations import parse_seconds
from calque.errors import InfrastructureError, RefusedError
from calque.ledger.budget_gate import check_lab_budget
from calque.models.pool_names import ForeignPoolError, pool_names
from calque.ops.base import Operation
from calque.ops.outcome import Failure, Outcome
from calque.ops.pool_group_models import PoolGroupPlan, PoolGroupRequest, PoolGroupResult
from calque.ops.pool_warmth import apply_warmth, plan_warmth, remove_warm_pool


class PoolGroupOp(Operation[PoolGroupRequest, PoolGroupPlan, PoolGroupResult]):
    name = "pool_group"
    Request = PoolGroupRequest

    def plan(self, request: PoolGroupRequest) -> PoolGroupPlan:
        try:
            return self._plan(request)
        except ForeignPoolError as exc:
            raise RefusedError(str(exc)) from None

    def _plan(self, request: PoolGroupRequest) -> PoolGroupPlan:
        names = pool_names(request.pool)
        spend = None
        if request.state == "present":
            assert request.instance_types
            spend = price_cohort(request.priced, request.instance_types, request.max_hourly_usd)
            check_spend_limit(spend)  # before anything else: a refused pool reads and makes nothing
        ec2, asg = self.aws.client("ec2"), self.aws.client("autoscaling")
        if spend is not None and request.lab_budget is not None:  # the lab's month: its pools and its sessions
            check_lab_budget(asg, self.aws.client("s3"), request.pool, request.lab_budget)
        before = grp.describe_group(asg, ec2, names.group, request.pool)
        template = None if request.gate_only else tpl.describe_template(ec2, names.template, request.pool)
        plan = PoolGroupPlan(request, names, before, template)
        if spend is not None:
            plan.spend, plan.hourly_usd = spend.sentence(), spend.hourly_usd
        if not request.gate_only:
            plan.warmth = plan_warmth(
                asg, names.group, before is not None, request.warm, request.schedule, request.min_size,
                absent=request.state == "absent",
            )  # fmt: skip
        if request.state == "absent":
            return self._plan_absent(plan)
        return self._plan_present(plan, ec2)

    def _plan_absent(self, plan: PoolGroupPlan) -> PoolGroupPlan:
        n = plan.names
        plan.actions += plan.warmth.actions if plan.warmth else []
        if plan.before is not None:
            plan.actions.append(
                f"drain group {n.group} to 0 ({len(plan.before.instances)} instance(s)), then delete it"
            )
        if plan.template is not None:
            plan.actions.append(f"delete launch template {n.template}")
        self._consent_warnings(plan)
        return plan

    def _plan_present(self, plan: PoolGroupPlan, ec2: Any) -> PoolGroupPlan:
        r, n, before = plan.request, plan.names, plan.before
        assert r.instance_types
        plan.desired = r.count if r.count is not None else (before.desired if before else r.min_size)
        plan.desired = min(max(plan.desired, r.min_size), r.top)
        if r.gate_only:
            self._size_actions(plan)
            self._consent_warnings(plan)
            return plan
        ttl_s = parse_seconds(r.ttl, what="ttl")
        lifetime = ttl_s if ttl_s >= grp.MIN_LIFETIME_S else None
        image_id, root_device = check_launch_inputs(
            ec2, self.aws.client("ssm"), self.aws.client("iam"), r.ami, r.ami_ssm_parameter, r.instance_profile,
            r.security_groups, r.subnets,
        )  # fmt: skip
        tags = {**{str(k): str(v) for k, v in r.tags.items()}, **n.tags}
        user_data = tpl.group_user_data(None if lifetime else ttl_s, r.user_data)
        inputs = tpl.TemplateInputs(
            image_id=image_id,
            root_device=root_device,
            instance_type=r.instance_types[0],
            user_data=user_data,
            volume_size_gib=r.root_volume.size_gib,
            volume_type=r.root_volume.type,
            kms_key_id=r.root_volume.kms_key_id,
            instance_profile=r.instance_profile,
            security_groups=r.security_groups,
            key_name=r.key_name,
            tags=tags,
            hibernate=r.warm is not None and r.warm.state == "Hibernated",
            capacity_block=r.capacity_block,
        )
        data, digest = tpl.template_data(inputs)
        tpl.dry_run(ec2, data, r.subnets[0] if r.subnets else None)
        plan.digest = digest
        old = plan.template
        issued = tpl.urls_valid_for(user_data)
        if old is None:
            plan.data = data
            plan.actions.append(f"create launch template {n.template} (config {digest})")
        elif old.digest != digest:
            plan.data = data
            plan.actions.append(f"new version of launch template {n.template}: config {old.digest} -> {digest}")
        elif tpl.needs_renewal(old, issued_for=issued):
            plan.data, plan.renew_only = data, True
            plan.actions.append(f"renew launch template {n.template}'s presigned runtime URLs (same config, no roll)")
        plan.shape = grp.GroupShape(
            min_size=r.min_size,
            max_size=r.top,
            instance_types=list(r.instance_types),
            subnets=list(r.subnets),
            on_demand_base=r.on_demand_base,
            spot=r.market == "spot",
            max_lifetime_s=lifetime,
            zones=[] if r.subnets else grp.default_zones(ec2),
            mixed=r.warm is None and r.capacity_block is None,  # a block: its one type, on the template
        )
        if before is None:
            plan.actions.append(f"create Auto Scaling group {n.group}: {r.min_size}..{r.top}, desired {plan.desired}")
        else:
            version = None if plan.data is None else "next"
            want = {
                **grp.shape_dict(plan.shape),
                "template_version": before.template_version if version is None else version,
            }
            have = grp.shape_of(before)
            if want != have:
                plan.update_shape = True
                diff = ", ".join(f"{k} {have.get(k)} -> {v}" for k, v in want.items() if have.get(k) != v)
                plan.actions.append(f"update group {n.group}: {diff}")
            self._size_actions(plan)
            plan.replace = [i.instance_id for i in before.unhealthy]
            if plan.replace:
                plan.actions.append(f"replace unhealthy instance(s) {', '.join(plan.replace)}")
            plan.roll = [
                i.instance_id for i in before.in_service if i.config != digest and i.instance_id not in plan.replace
            ]
            if plan.roll:
                plan.actions.append(
                    f"roll {len(plan.roll)} instance(s) launched from an older config ({', '.join(plan.roll)}) "
                    f"to config {digest}, keeping at least {r.min_healthy_percentage}% healthy"
                )
        plan.actions += plan.warmth.actions if plan.warmth else []
        self._consent_warnings(plan)
        return plan

    def _size_actions(self, plan: PoolGroupPlan) -> None:
        if plan.before is not None and plan.before.desired != plan.desired:
            verb = "scale out" if plan.desired > plan.before.desired else "scale in"
            plan.actions.append(f"{verb} group {plan.names.group}: desired {plan.before.desired} -> {plan.desired}")

    def _consent_warnings(self, plan: PoolGroupPlan) -> None:
        consent = plan.request.consent()
        if plan.launches and not consent.spend:
            plan.warnings.append(f"the real run will be refused ({plan.spend}): pass {SPEND_FLAGS}")
        if plan.ends and not consent.terminate:
            plan.warnings.append(
                f"the real run will be refused: it ends {len(plan.ends)} instance(s); pass {TERMINATE_FLAGS}"
            )

    def _require_consent(self, plan: PoolGroupPlan) -> None:
        consent = plan.request.consent()
        if plan.launches and not consent.spend:
            raise RefusedError(
                f"pool {plan.request.pool} would launch instances (up to {plan.spend}); to proceed pass {SPEND_FLAGS}"
            )
        require_terminate_consent(consent, plan.ends)

    def check(self, plan: PoolGroupPlan) -> Outcome[PoolGroupResult]:
        return self._outcome(plan, self._result(plan, predicted=True), True)

    def apply(self, plan: PoolGroupPlan) -> Outcome[PoolGroupResult]:
        self._require_consent(plan)
        if plan.request.gate_only or not plan.changes:
            return self._outcome(plan, self._result(plan, predicted=False), False)
        ec2, asg = self.aws.client("ec2"), self.aws.client("autoscaling")
        if plan.request.state == "absent":
            failure = self._drain_and_delete(plan, asg, ec2)
            return self._outcome(plan, self._result(plan, predicted=False), False, failure)
        n, shape = plan.names, plan.shape
        assert shape is not None
        template = plan.template
        if plan.data is not None:
            assert plan.digest is not None
            template = tpl.put_version(ec2, n.template, template, plan.data, plan.digest, n.tags)
            self.say(f"launch template {n.template} version {template.version} (config {plan.digest})")
        assert template is not None
        params = grp.group_params(n.group, shape, template.template_id, template.version)
        tags = {**{str(k): str(v) for k, v in plan.request.tags.items()}, **n.tags}
        if plan.before is None:
            grp.create_group(asg, params, plan.desired, tags)
        else:
            if plan.update_shape:
                grp.update_group(asg, params)
            if plan.before.desired != plan.desired:
                grp.set_desired(asg, n.group, plan.desired)
        grp.tag_group(asg, n.group, grp.usage_tag(plan.request.pool, plan.request.bucket, plan.request.prefix))
        if plan.warmth is not None:
            apply_warmth(asg, plan.warmth)
        replaced = grp.replace(asg, plan.replace)
        refresh_id = None
        if plan.roll:
            running = grp.refresh_in_progress(asg, n.group)
            if running is not None:
                refresh_id = str(running.get("InstanceRefreshId"))
                plan.warnings.append(f"an instance refresh ({refresh_id}) is already rolling group {n.group}")
            else:
                refresh_id = grp.start_refresh(
                    asg, n.group, plan.request.min_healthy_percentage, plan.request.instance_warmup
                )
        result = self._result(plan, predicted=False)
        result.replaced, result.refresh_id = replaced, refresh_id
        return self._outcome(plan, result, False)

    def _drain_and_delete(self, plan: PoolGroupPlan, asg: Any, ec2: Any) -> Failure | None:
        n = plan.names
        if plan.warmth is not None:
            remove_warm_pool(asg, plan.warmth)
        if plan.before is not None:
            asg.update_auto_scaling_group(AutoScalingGroupName=n.group, MinSize=0, DesiredCapacity=0)
            deadline = time.monotonic() + plan.request.wait_timeout
            while True:  # the termination lifecycle hook lets each worker release its claims first
                now = grp.describe_group(asg, ec2, n.group, plan.request.pool)
                if now is None or not now.instances:
                    break
                if time.monotonic() > deadline:
                    return Failure(
                        message=f"group {n.group} still has {len(now.instances)} instance(s) draining after "
                        f"{plan.request.wait_timeout}s; run teardown again to finish (nothing else was deleted)",
                        exit_code=InfrastructureError.exit_code,
                    )
                time.sleep(5)
            grp.delete_group(asg, n.group)
        if plan.template is not None:
            tpl.delete_template(ec2, n.template, plan.request.pool)
        return None

    def _result(self, plan: PoolGroupPlan, *, predicted: bool) -> PoolGroupResult:
        n, r = plan.names, plan.request
        if not predicted and plan.changes and r.state == "absent":
            ended = [i.instance_id for i in plan.before.instances] if plan.before else []
            return PoolGroupResult(pool=r.pool, group=n.group, template=n.template, instances=ended, spend=plan.spend)
        if not predicted and plan.changes:
            now = grp.describe_group(self.aws.client("autoscaling"), self.aws.client("ec2"), n.group, r.pool)
            version = (
                int(now.template_version) if now and now.template_version and now.template_version.isdigit() else None
            )
            return PoolGroupResult(
                pool=r.pool, group=n.group, template=n.template, template_version=version,
                config=plan.digest or (plan.template.digest if plan.template else None),
                min_size=now.min_size if now else 0, max_size=now.max_size if now else 0,
                desired=now.desired if now else 0, instances=[i.instance_id for i in now.instances] if now else [],
                rolling=list(plan.roll), spend=plan.spend,
            )  # fmt: skip
        b, absent = plan.before, r.state == "absent"
        return PoolGroupResult(
            pool=r.pool, group=n.group, template=n.template,
            template_version=plan.template.version if plan.template else None,
            config=plan.digest or (plan.template.digest if plan.template else None),
            min_size=0 if absent else r.min_size if predicted else (b.min_size if b else 0),
            max_size=0 if absent else r.top if predicted else (b.max_size if b else 0),
            desired=0 if absent else plan.desired if predicted else (b.desired if b else 0),
            instances=[i.instance_id for i in b.instances] if b else [], rolling=list(plan.roll), spend=plan.spend,
        )  # fmt: skip

    def _outcome(
        self, plan: PoolGroupPlan, result: PoolGroupResult, check_mode: bool, failure: Failure | None = None
    ) -> Outcome[PoolGroupResult]:
        b = plan.before
        before = {
            "exists": b is not None,
            "config": plan.template.digest if plan.template else None,
            "template_version": plan.template.version if plan.template else None,
            "desired": b.desired if b else 0,
            "instances": [i.instance_id for i in b.instances] if b else [],
            **(plan.warmth.before() if plan.warmth else {}),
        }
        after = {
            "exists": plan.request.state == "present",
            "config": plan.digest if plan.request.state == "present" else None,
            "template_version": result.template_version if not check_mode else before["template_version"],
            "desired": result.desired,
            "rolls": list(plan.roll),
            "replaces": list(plan.replace),
            **(plan.warmth.after() if plan.warmth else {}),
        }
        return Outcome[PoolGroupResult](
            resource=self.name,
            check_mode=check_mode,
            changed=plan.changes and not plan.request.gate_only,
            before=before,
            after=after,
            actions=list(plan.actions),
            warnings=list(plan.warnings),
            failure=failure,
            result=result,
        )
