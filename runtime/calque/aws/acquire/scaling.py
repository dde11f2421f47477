"""How a pool's Auto Scaling group follows its queue, down to zero and back (issue 10, section 3).

Four parts, all named from the pool (``calque.models.pool_names``) and owned by the Acquirer's side:

- a target-tracking policy ``<base>-backlog`` on **backlog per instance**: CloudWatch metric math
  ``(visible + inflight) / inservice`` over SQS ``ApproximateNumberOfMessagesVisible`` and
  ``...NotVisible`` and the group's ``GroupInServiceInstances``. Its target is
  ``backlog_target = max(1, floor(latency_s / seconds_per_claim))``: the claims one instance can
  work through, one after another, within the latency the pool asks for, so the group grows until
  each instance's share of the queue fits in that latency;
- out of zero, a step policy ``<base>-wake`` (exact capacity 1) on alarm ``<base>-wake``: visible
  messages while no instance is in service. Target tracking cannot do this: at zero instances
  backlog per instance is undefined (a division by zero), so its alarm never fires;
- down to zero, a step policy ``<base>-idle`` (exact capacity 0) on alarm ``<base>-idle``: nothing
  visible or in flight for ``idle_s`` (whole minutes; missing SQS data counts as idle, since SQS
  stops publishing for an inactive queue);
- a termination lifecycle hook ``calque-drain`` that holds a terminating instance until its worker
  has released its claims and run ``@exit`` (``calque.pool.worker.instance``), or ``drain_timeout_s``.

The group must collect ``GroupInServiceInstances`` (1-minute metrics), which is turned on here too.
Everything is compared before it is written (only the fields calque sets: AWS and moto add their
own), so a second run changes nothing, and check mode is the same plan, unapplied.
"""

from __future__ import annotations

import math
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import Field

from calque.aws.acquire.group_status import GroupView, describe_group, policy_names, refuse_other_pools
from calque.aws.aws_errors import aws_errors, is_not_found, translate
from calque.models import QueueDepth
from calque.models.base import CalqueModel
from calque.models.pool_names import POOL_TAG, PoolNames

TERMINATION_HOOK = "calque-drain"
"""The lifecycle hook a worker completes once it has drained (the same name in every pool's group)."""
GROUP_METRICS = ["GroupDesiredCapacity", "GroupInServiceInstances"]
_PERIOD_S = 60


def drain_hooks(drain_timeout_s: int) -> dict[str, dict[str, Any]]:
    """The group's one lifecycle hook: an instance the group ends is held (up to ``drain_timeout_s``)
    for its workers or sessions to drain, then ended even if none answers."""
    return {
        TERMINATION_HOOK: {
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
            "HeartbeatTimeout": drain_timeout_s,
            "DefaultResult": "CONTINUE",
        }
    }


def backlog_target(latency_s: float, seconds_per_claim: float) -> int:
    """Claims per instance the policy aims at: ``max(1, floor(latency_s / seconds_per_claim))``."""
    if latency_s <= 0 or seconds_per_claim <= 0:
        raise ValueError("latency_s and seconds_per_claim must be positive")
    return max(1, math.floor(latency_s / seconds_per_claim))


class ScalingSettings(CalqueModel):
    """What a pool asks of its scaling: measured seconds per claim, wanted latency, idle and drain times."""

    seconds_per_claim: float = Field(gt=0, description="measured: a claim's claim_seconds on this pool")
    latency_s: float = Field(gt=0, description="how long a submitted claim may wait for a worker")
    idle_s: int = Field(900, ge=60, le=86400, description="empty for this long, the group scales to zero")
    warmup_s: int = Field(300, ge=0, le=3600, description="an instance's boot and @enter, before it counts")
    drain_timeout_s: int = Field(300, ge=30, le=7200, description="the lifecycle hook's wait for a worker to drain")
    buffer: int = Field(0, ge=0, le=1000, description="instances kept beyond the backlog's need while active")

    @property
    def target(self) -> int:
        return backlog_target(self.latency_s, self.seconds_per_claim)

    @property
    def idle_periods(self) -> int:
        return math.ceil(self.idle_s / _PERIOD_S)


class ScalingState(CalqueModel):
    """A pool's scaling parts, as calque compares them: by name, only the fields calque sets."""

    group_exists: bool
    policies: dict[str, dict[str, Any]] = Field(default_factory=dict)
    alarms: dict[str, dict[str, Any]] = Field(default_factory=dict)  # AlarmActions as policy names
    hooks: dict[str, dict[str, Any]] = Field(default_factory=dict)
    metrics: list[str] = Field(default_factory=list)

    def differs(self, want: ScalingState | None) -> bool:
        """Whether reaching ``want`` (None: absent) from this state changes anything."""
        if want is None:
            return bool(self.policies or self.alarms or self.hooks)
        return self.model_dump(exclude={"group_exists"}) != want.model_dump(exclude={"group_exists"})

    def actions_to(self, want: ScalingState | None) -> list[str]:
        """What reaching ``want`` does, one line per part (the plan's words in check mode and diff)."""
        if not self.differs(want):
            return []
        if want is None:
            return [f"delete {n}" for n in (*self.alarms, *self.policies, *self.hooks)]
        out = [f"put scaling policy {n}" for n, d in want.policies.items() if self.policies.get(n) != d]
        out += [f"put lifecycle hook {n}" for n, d in want.hooks.items() if self.hooks.get(n) != d]
        out += [f"put alarm {n}" for n, d in want.alarms.items() if self.alarms.get(n) != d]
        if sorted(self.metrics) != sorted(want.metrics):
            out.insert(0, f"collect {', '.join(want.metrics)} for the group")
        return out


def _stat(qid: str, namespace: str, metric: str, dim: str, value: str, stat: str, period: bool) -> dict[str, Any]:
    stat_doc: dict[str, Any] = {
        "Metric": {"Namespace": namespace, "MetricName": metric, "Dimensions": [{"Name": dim, "Value": value}]},
        "Stat": stat,
    }
    if period:  # alarms' queries carry a period; target tracking's do not
        stat_doc["Period"] = _PERIOD_S
    return {"Id": qid, "MetricStat": stat_doc, "ReturnData": False}


def _queries(names: PoolNames, *, period: bool, inservice: bool) -> list[dict[str, Any]]:
    out = [
        _stat("visible", "AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", names.queue, "Sum", period),
        _stat("inflight", "AWS/SQS", "ApproximateNumberOfMessagesNotVisible", "QueueName", names.queue, "Sum", period),
    ]
    if inservice:
        out.append(
            _stat(
                "inservice",
                "AWS/AutoScaling",
                "GroupInServiceInstances",
                "AutoScalingGroupName",
                names.group,
                "Average",
                period,
            )
        )
    return out


def desired_scaling(names: PoolNames, s: ScalingSettings) -> ScalingState:
    """Every scaling part ``names``' pool should have under ``s``."""
    backlog, wake, idle = policy_names(names)
    step = {"PolicyType": "StepScaling", "AdjustmentType": "ExactCapacity", "MetricAggregationType": "Maximum"}
    # buffer_containers: b extra instances is b x target more claims to share, so the policy's
    # equilibrium is backlog / target + b in service (still undefined at zero: the wake alarm's job)
    extra = f" + {s.buffer * s.target}" if s.buffer else ""
    per_instance = {
        "Id": "backlog_per_instance",
        "Expression": f"(visible + inflight{extra}) / inservice",
        "Label": "claims visible or in flight per in-service instance" + (f", plus {s.buffer} buffer" if extra else ""),
        "ReturnData": True,
    }
    policies = {
        backlog: {
            "PolicyType": "TargetTrackingScaling",
            "EstimatedInstanceWarmup": s.warmup_s,
            "TargetTrackingConfiguration": {
                "CustomizedMetricSpecification": {
                    "Metrics": [*_queries(names, period=False, inservice=True), per_instance]
                },
                "TargetValue": float(s.target),
                "DisableScaleIn": False,
            },
        },
        wake: {
            **step,
            "EstimatedInstanceWarmup": s.warmup_s,
            "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}],
        },
        idle: {**step, "StepAdjustments": [{"MetricIntervalUpperBound": 0.0, "ScalingAdjustment": 0}]},
    }
    alarm = {"ActionsEnabled": True, "EvaluationPeriods": 1, "DatapointsToAlarm": 1}
    alarms = {
        wake: {
            **alarm,
            "AlarmDescription": f"calque pool {names.pool}: claims are waiting and no instance is in service",
            "Metrics": [
                *_queries(names, period=True, inservice=True)[::2],  # visible, inservice
                {
                    "Id": "waiting",
                    "Expression": "IF(FILL(inservice, 0) == 0 AND visible > 0, 1, 0)",
                    "ReturnData": True,
                },
            ],
            "ComparisonOperator": "GreaterThanOrEqualToThreshold",
            "Threshold": 1.0,
            "TreatMissingData": "notBreaching",
            "AlarmActions": [wake],
        },
        idle: {
            **alarm,
            "AlarmDescription": f"calque pool {names.pool}: nothing visible or in flight for {s.idle_s}s",
            "Metrics": [
                *_queries(names, period=True, inservice=False),
                {"Id": "backlog", "Expression": "FILL(visible, 0) + FILL(inflight, 0)", "ReturnData": True},
            ],
            "EvaluationPeriods": s.idle_periods,
            "DatapointsToAlarm": s.idle_periods,
            "ComparisonOperator": "LessThanOrEqualToThreshold",
            "Threshold": 0.0,
            "TreatMissingData": "breaching",
            "AlarmActions": [idle],
        },
    }
    hooks = drain_hooks(s.drain_timeout_s)
    return ScalingState(group_exists=True, policies=policies, alarms=alarms, hooks=hooks, metrics=list(GROUP_METRICS))


def project(actual: Any, wanted: Any) -> Any:
    """``actual`` cut down to the shape of ``wanted``: the fields calque did not set are not compared."""
    if isinstance(wanted, dict) and isinstance(actual, dict):
        return {k: project(actual[k], v) for k, v in wanted.items() if k in actual}
    if isinstance(wanted, list) and isinstance(actual, list) and len(wanted) == len(actual):
        return [project(a, w) for a, w in zip(actual, wanted, strict=True)]
    return actual


class PoolScaling:
    """Reads and writes one pool's scaling parts. ``autoscaling`` and ``cloudwatch`` are boto3 clients."""

    def __init__(self, autoscaling: Any, cloudwatch: Any, names: PoolNames) -> None:
        self.asg = autoscaling
        self.cw = cloudwatch
        self.names = names
        self.policy_arns: dict[str, str] = {}  # filled by ``read``

    def group(self) -> GroupView | None:
        return describe_group(self.asg, self.names)

    def read(self, like: ScalingState) -> ScalingState:
        """The parts that exist now, each projected onto the shape of ``like`` (the desired state)."""
        group = self.group()
        if group is not None:
            refuse_other_pools("Auto Scaling group", group.name, group.tags, self.names.pool)
        alarms = self._alarms(list(like.alarms))
        if group is None:
            return ScalingState(group_exists=False, alarms=project(alarms, like.alarms))
        with aws_errors(f"describe the scaling policies of {group.name}"):
            raw = self.asg.describe_policies(AutoScalingGroupName=group.name)["ScalingPolicies"]
            hooks = self.asg.describe_lifecycle_hooks(AutoScalingGroupName=group.name)["LifecycleHooks"]
        policies = {p["PolicyName"]: p for p in raw if p["PolicyName"] in like.policies}
        self.policy_arns = {k: str(v["PolicyARN"]) for k, v in policies.items()}
        hook_map = {h["LifecycleHookName"]: h for h in hooks if h["LifecycleHookName"] in like.hooks}
        return ScalingState(
            group_exists=True,
            policies={k: project(v, like.policies[k]) for k, v in policies.items()},
            alarms={k: project(v, like.alarms[k]) for k, v in alarms.items()},
            hooks={k: project(v, like.hooks[k]) for k, v in hook_map.items()},
            metrics=[m for m in group.metrics if m in like.metrics],
        )

    def _alarms(self, names: list[str]) -> dict[str, dict[str, Any]]:
        with aws_errors("describe the pool's CloudWatch alarms"):
            found = self.cw.describe_alarms(AlarmNames=names).get("MetricAlarms", []) if names else []
        out: dict[str, dict[str, Any]] = {}
        for a in found:
            self._refuse_foreign_alarm(a)
            doc = dict(a)
            doc["AlarmActions"] = [arn.rsplit("policyName/", 1)[-1] for arn in a.get("AlarmActions", [])]
            out[a["AlarmName"]] = doc
        return out

    def _refuse_foreign_alarm(self, alarm: dict[str, Any]) -> None:
        try:
            tags = self.cw.list_tags_for_resource(ResourceARN=alarm["AlarmArn"]).get("Tags", [])
        except (ClientError, BotoCoreError) as exc:
            if is_not_found(exc):
                return
            raise translate(exc, f"read the tags of alarm {alarm['AlarmName']}") from exc
        refuse_other_pools("CloudWatch alarm", alarm["AlarmName"], tags, self.names.pool)

    # -- changing ----------------------------------------------------------------------------------

    def ensure(self, current: ScalingState, want: ScalingState) -> list[str]:
        """Write what differs between ``current`` and ``want``; one sentence per change."""
        group, done = self.names.group, []
        with aws_errors(f"set the scaling of Auto Scaling group {group}"):
            if sorted(current.metrics) != sorted(want.metrics):
                self.asg.enable_metrics_collection(
                    AutoScalingGroupName=group, Metrics=want.metrics, Granularity="1Minute"
                )
                done.append(f"collect {', '.join(want.metrics)} for {group}")
            arns = dict(self.policy_arns)  # the alarms act on the policies' ARNs
            for name, doc in want.policies.items():
                if current.policies.get(name) != doc:
                    put = self.asg.put_scaling_policy(AutoScalingGroupName=group, PolicyName=name, **doc)
                    arns[name] = str(put.get("PolicyARN") or self._policy_arn(name))
                    done.append(f"put scaling policy {name}")
            for name, doc in want.hooks.items():
                if current.hooks.get(name) != doc:
                    self.asg.put_lifecycle_hook(AutoScalingGroupName=group, LifecycleHookName=name, **doc)
                    done.append(f"put lifecycle hook {name}")
            for name, doc in want.alarms.items():
                if current.alarms.get(name) != doc:
                    actions = [arns[p] for p in doc["AlarmActions"]]
                    tags = [{"Key": POOL_TAG, "Value": self.names.pool}]
                    self.cw.put_metric_alarm(AlarmName=name, **{**doc, "AlarmActions": actions}, Tags=tags)
                    done.append(f"put alarm {name}")
        return done

    def _policy_arn(self, name: str) -> str:
        # moto 5.2 answers PutScalingPolicy without the ARN (AWS returns it): read it back
        found = self.asg.describe_policies(AutoScalingGroupName=self.names.group, PolicyNames=[name])["ScalingPolicies"]
        return str(found[0]["PolicyARN"])

    def remove(self, current: ScalingState) -> list[str]:
        """Delete the alarms, policies and hook that exist; one sentence per deletion."""
        done = []
        with aws_errors(f"remove the scaling of {self.names.group}"):
            if current.alarms:
                self.cw.delete_alarms(AlarmNames=sorted(current.alarms))
                done += [f"delete alarm {n}" for n in sorted(current.alarms)]
            for name in sorted(current.policies):
                self.asg.delete_policy(AutoScalingGroupName=self.names.group, PolicyName=name)
                done.append(f"delete scaling policy {name}")
            for name in sorted(current.hooks):
                self.asg.delete_lifecycle_hook(AutoScalingGroupName=self.names.group, LifecycleHookName=name)
                done.append(f"delete lifecycle hook {name}")
        return done


class ScalingStatus(CalqueModel):
    """A pool's size next to its backlog: what ``calque pool status --pool --json`` prints
    (``calque.models.pool_views.ScalingStatusView`` is its pydantic-free twin, for the human output)."""

    pool: str
    group_name: str
    group_exists: bool
    min_size: int | None = None
    max_size: int | None = None
    desired: int | None = None
    in_service: int | None = None
    backlog: int = Field(ge=0, description="claims visible or in flight on the pool's queue")
    backlog_per_instance: float | None = Field(None, description="None at zero in-service instances")
    target: float | None = Field(None, description="the backlog policy's target; None without the policy")
    queue: QueueDepth
