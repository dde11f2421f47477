"""A pool's scaling on its queue against moto: backlog target tracking, wake and idle alarms, drain hook.

moto 5.2 stores every field calque sets on the policies, alarms and hook (compared below); it does
not evaluate alarms nor run step policies, so what an alarm does at zero is checked in its metric
math and actions, not by waiting for a scale-out.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from calque.aws.acquire.scaling import TERMINATION_HOOK, backlog_target, policy_names
from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.errors import RefusedError, UsageError
from calque.models import QueueSettings
from calque.models.pool_names import pool_names
from calque.ops.pool_scaling import PoolScalingOp

from acquire.scaling_fixtures import make_group

POOL = "lab-a/embedder"


def _run(check: bool = False, **options: Any) -> Any:
    op = PoolScalingOp()
    params = {"pool": POOL, "seconds_per_claim": 12.5, "latency_s": 300, **options}
    return op.run(op.request(params), check_mode=check)


def _policies(group: str) -> dict[str, dict[str, Any]]:
    found = client("autoscaling").describe_policies(AutoScalingGroupName=group)["ScalingPolicies"]
    return {p["PolicyName"]: p for p in found}


def _alarms() -> dict[str, dict[str, Any]]:
    return {a["AlarmName"]: a for a in client("cloudwatch").describe_alarms()["MetricAlarms"]}


@pytest.mark.parametrize(
    ("latency_s", "seconds_per_claim", "target"), [(300, 12.5, 24), (299, 100, 2), (10, 30, 1), (60, 60, 1)]
)
def test_the_target_is_latency_over_seconds_per_claim_never_below_one(
    latency_s: float, seconds_per_claim: float, target: int
) -> None:
    assert backlog_target(latency_s, seconds_per_claim) == target


def test_present_tracks_backlog_per_instance_and_a_second_run_changes_nothing(moto: str) -> None:
    group = make_group(POOL)
    names = pool_names(POOL)
    backlog, wake, idle = policy_names(names)
    first = _run()
    assert first.changed and first.failure is None and first.result.target_backlog_per_instance == 24
    tracking = _policies(group)[backlog]["TargetTrackingConfiguration"]
    assert tracking["TargetValue"] == 24.0
    metrics = {m["Id"]: m for m in tracking["CustomizedMetricSpecification"]["Metrics"]}
    assert metrics["backlog_per_instance"]["Expression"] == "(visible + inflight) / inservice"
    assert [m["Id"] for m in metrics.values() if m["ReturnData"]] == ["backlog_per_instance"]
    assert metrics["visible"]["MetricStat"]["Metric"]["Dimensions"] == [{"Name": "QueueName", "Value": names.queue}]
    assert metrics["inflight"]["MetricStat"]["Metric"]["MetricName"] == "ApproximateNumberOfMessagesNotVisible"
    assert metrics["inservice"]["MetricStat"]["Metric"]["Dimensions"] == [
        {"Name": "AutoScalingGroupName", "Value": group}
    ]
    alarms = _alarms()
    assert alarms[wake]["AlarmActions"] == [_policies(group)[wake]["PolicyARN"]]
    assert alarms[idle]["AlarmActions"] == [_policies(group)[idle]["PolicyARN"]]
    assert (
        alarms[idle]["EvaluationPeriods"] == 15 and alarms[idle]["ComparisonOperator"] == "LessThanOrEqualToThreshold"
    )
    assert _policies(group)[wake]["StepAdjustments"][0]["ScalingAdjustment"] == 1
    assert _policies(group)[idle]["StepAdjustments"][0]["ScalingAdjustment"] == 0
    (hook,) = client("autoscaling").describe_lifecycle_hooks(AutoScalingGroupName=group)["LifecycleHooks"]
    assert hook["LifecycleHookName"] == TERMINATION_HOOK
    assert hook["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    enabled = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    assert {m["Metric"] for m in enabled[0]["EnabledMetrics"]} >= {"GroupInServiceInstances"}

    second = _run()
    assert second.changed is False and second.actions == []


def test_check_mode_plans_every_part_and_writes_none(moto: str) -> None:
    group = make_group(POOL)
    planned = _run(check=True)
    assert planned.check_mode and planned.changed
    assert any("put scaling policy" in a for a in planned.actions)
    assert planned.after["policies"] and not planned.before["policies"]
    assert _policies(group) == {} and _alarms() == {}


def test_a_new_latency_changes_only_the_target_and_the_diff_shows_it(moto: str) -> None:
    make_group(POOL)
    _run()
    backlog = policy_names(pool_names(POOL))[0]
    changed = _run(check=True, latency_s=600)
    assert changed.actions == [f"put scaling policy {backlog}"]
    before = changed.before["policies"][backlog]["TargetTrackingConfiguration"]["TargetValue"]
    after = changed.after["policies"][backlog]["TargetTrackingConfiguration"]["TargetValue"]
    assert (before, after) == (24.0, 48.0)
    assert _run(latency_s=600).changed and _run(latency_s=600).changed is False


def test_without_a_group_check_mode_warns_and_the_real_run_fails_writing_nothing(moto: str) -> None:
    planned = _run(check=True)
    assert planned.changed and any("no Auto Scaling group" in w for w in planned.warnings)
    real = _run()
    assert real.failure is not None and "create it first" in real.failure.message
    assert _alarms() == {}


def test_a_group_tagged_for_another_pool_is_refused(moto: str) -> None:
    make_group(POOL, tag_pool="lab-b/embedder")
    with pytest.raises(RefusedError, match="tagged calque:pool='lab-b/embedder'"):
        _run()
    assert _alarms() == {}


def test_present_without_measurements_says_what_to_give(moto: str) -> None:
    op = PoolScalingOp()
    with pytest.raises(UsageError, match="seconds_per_claim"):
        op.request({"pool": POOL})
    with pytest.raises(UsageError, match="pool name"):
        op.request({"pool": "Lab A", "seconds_per_claim": 1, "latency_s": 1})


def test_two_pools_keep_their_own_scaling_and_absent_removes_only_its_own(moto: str) -> None:
    other = "lab-b/embedder"
    make_group(POOL)
    other_group = make_group(other)
    _run()
    _run(pool=other)
    gone = _run(state="absent", seconds_per_claim=None, latency_s=None)
    assert gone.changed and gone.result.alarms == []
    assert _policies(pool_names(POOL).group) == {}
    assert set(_policies(other_group)) == set(policy_names(pool_names(other)))
    assert set(_alarms()) == set(policy_names(pool_names(other))[1:])
    again = _run(state="absent", seconds_per_claim=None, latency_s=None)
    assert again.changed is False


def test_pool_status_shows_size_backlog_per_instance_and_target(moto: str, capsys: Any) -> None:
    from calque.cli.main import run

    group = make_group(POOL, desired=2)
    names = pool_names(POOL)
    queue = PoolQueue(client("sqs"), POOL, names.queue)
    queue.ensure(QueueSettings(encryption=False))
    sqs, url = client("sqs"), queue.url()
    for i in range(5):
        sqs.send_message(QueueUrl=url, MessageBody=str(i))
    _run()
    assert run(["pool", "status", "--pool", POOL, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["group_name"] == group and doc["desired"] == 2 and doc["in_service"] == 2
    assert doc["backlog"] == 5 and doc["backlog_per_instance"] == 2.5 and doc["target"] == 24.0
    assert run(["pool", "status", "--pool", POOL]) == 0
    human = capsys.readouterr().out
    assert "per instance" in human and "2.5" in human and "24" in human
    assert run(["pool", "status"]) == 2


def test_the_cli_verb_plans_applies_and_then_has_nothing_to_do(moto: str, capsys: Any) -> None:
    from calque.cli.main import run

    group = make_group(POOL)
    args = ["pool", "scaling", "--pool", POOL, "--seconds-per-claim", "12.5", "--latency", "5m"]
    assert run([*args, "--check", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["changed"] and planned["check_mode"] and planned["result"]["target_backlog_per_instance"] == 24
    assert _policies(group) == {}
    assert run(args) == 0
    assert "changed" in capsys.readouterr().out and len(_policies(group)) == 3
    assert run([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changed"] is False
    assert run(["pool", "scaling", "--pool", POOL]) == 2
    assert "seconds_per_claim" in capsys.readouterr().err
