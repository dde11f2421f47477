"""A pool's warm pool, launching hook and scheduled warmth (``calque.ops.pool_group``) against the moto server.

moto 5.2 stores warm pools (PutWarmPool, DescribeWarmPool, DeleteWarmPool), lifecycle hooks and
scheduled actions as AWS does; it makes no warm instances (DescribeWarmPool's Instances is always
empty), so what a warmed instance does is tested on the bootstrap's side (tests/pool/test_warm_bootstrap.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from calque.aws.acquire.warm_pool import LAUNCH_HOOK, supports_hibernation
from calque.aws.clients import client
from calque.cli.main import cli
from calque.models.pool_names import pool_names
from calque.ops.base import AwsSession
from calque.ops.pool_group import PoolGroupOp
from calque.ops.pool_group_models import PoolGroupRequest
from click.testing import CliRunner
from pydantic import ValidationError

from .conftest import AL2023, Network

CONSENT = {"i_understand_this_spends_money": True, "i_understand_this_terminates_instances": True}
GROUP = pool_names("lab-a/embedder").group
WARM = {"state": "Stopped", "min_size": 1, "max_prepared": 3}


@pytest.fixture
def make(network: Network) -> Any:
    def request(**kw: Any) -> PoolGroupRequest:
        base: dict[str, Any] = {
            "pool": "lab-a/embedder",
            "count": 0,
            "max_size": 3,
            "market": "on-demand",
            "instance_types": ["g6.xlarge"],
            "subnets": network.subnets,
            "ami_ssm_parameter": AL2023,
            "user_data": "#!/bin/sh\necho warm\n",
            "max_hourly_usd": 50,
            "warm": WARM,
            **CONSENT,
        }
        base.update(kw)
        return PoolGroupRequest(**base)

    return request


def run(req: PoolGroupRequest, check: bool = False) -> Any:
    return PoolGroupOp(AwsSession()).run(req, check_mode=check)


def warm_pool() -> dict[str, Any] | None:
    found = client("autoscaling").describe_warm_pool(AutoScalingGroupName=GROUP)
    config: dict[str, Any] | None = found.get("WarmPoolConfiguration")
    return config


def hooks() -> dict[str, dict[str, Any]]:
    found = client("autoscaling").describe_lifecycle_hooks(AutoScalingGroupName=GROUP)["LifecycleHooks"]
    return {h["LifecycleHookName"]: h for h in found}


def test_a_warm_pool_and_its_launching_hook_are_made_then_nothing_changes_twice(make: Any) -> None:
    out = run(make())
    assert out.changed and any("create the warm pool" in a for a in out.actions)
    wp = warm_pool()
    assert wp is not None and wp["PoolState"] == "Stopped" and wp["MinSize"] == 1
    assert wp["MaxGroupPreparedCapacity"] == 3 and wp["InstanceReusePolicy"] == {"ReuseOnScaleIn": True}
    hook = hooks()[LAUNCH_HOOK]
    assert hook["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_LAUNCHING" and hook["DefaultResult"] == "ABANDON"
    g = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]
    assert "LaunchTemplate" in g and not g.get("MixedInstancesPolicy")  # AWS refuses a warm pool beside one
    for _ in range(2):
        again = run(make())
        assert not again.changed and again.actions == []


def test_a_warm_pool_settings_change_is_a_diff_and_one_put_not_a_roll(make: Any) -> None:
    first = run(make(count=1))
    version = first.result.template_version
    changed = make(count=1, warm={**WARM, "state": "Running", "min_size": 2})
    planned = run(changed, check=True)
    assert planned.changed and planned.result.rolling == []
    assert (
        planned.before["warm_pool"]["PoolState"] == "Stopped" and planned.after["warm_pool"]["PoolState"] == "Running"
    )
    assert planned.before["config"] == planned.after["config"]  # same template: nothing rolls
    assert warm_pool()["PoolState"] == "Stopped"  # type: ignore[index]  # check mode wrote nothing
    done = run(changed)
    assert done.changed and done.result.template_version == version and done.result.refresh_id is None
    assert warm_pool()["PoolState"] == "Running" and warm_pool()["MinSize"] == 2  # type: ignore[index]
    assert not run(changed).changed


def test_removing_the_warm_pool_from_inventory_deletes_it_and_the_hook_and_teardown_deletes_all(make: Any) -> None:
    run(make())
    out = run(make(warm=None))
    assert out.changed and warm_pool() is None and LAUNCH_HOOK not in hooks()
    run(make())
    gone = run(make(state="absent"))
    assert any("delete the warm pool" in a for a in gone.actions)
    assert client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"] == []


def test_hibernated_only_where_aws_lists_the_family_and_no_warm_pool_beside_spot(make: Any) -> None:
    assert not supports_hibernation("g6.xlarge") and not supports_hibernation("p5.48xlarge")
    assert supports_hibernation("m5.large") and not supports_hibernation("m5.metal")
    with pytest.raises(ValidationError, match=r"g6\.xlarge cannot hibernate"):
        make(warm={**WARM, "state": "Hibernated"})
    with pytest.raises(ValidationError, match="market: on-demand and exactly one instance type"):
        make(market="spot")
    with pytest.raises(ValidationError, match="exactly one instance type"):
        make(instance_types=["g6.xlarge", "g5.xlarge"])
    accepted = make(instance_types=["m5.large"], warm={**WARM, "state": "Hibernated"})  # (no GPU: no rate here)
    assert accepted.warm is not None and accepted.warm.state == "Hibernated"


def test_warmed_instances_are_priced_by_the_spend_gate(make: Any) -> None:
    out = run(make(warm={**WARM, "min_size": 2}), check=True)
    assert out.result.spend.startswith("5 x g6.xlarge")  # max_size 3, and 2 bootstrapping into the warm pool


def test_inventory_windows_become_scheduled_actions_and_a_second_run_changes_nothing(make: Any) -> None:
    window = {"name": "class", "at": "0 10 * * 1-5", "duration": "2h", "instances": 2, "lead": "10m"}
    out = run(make(schedule=[window]))
    assert out.changed
    found = client("autoscaling").describe_scheduled_actions(AutoScalingGroupName=GROUP)
    actions = {a["ScheduledActionName"]: a for a in found["ScheduledUpdateGroupActions"]}
    start, end = actions["calque-sched-class-start"], actions["calque-sched-class-end"]
    assert start["Recurrence"] == "50 9 * * 1-5" and start["MinSize"] == 2  # a class at 10:00 gets them at 09:50
    assert end["Recurrence"] == "0 12 * * 1-5" and end["MinSize"] == 0
    assert not run(make(schedule=[window])).changed
    run(make(schedule=[]))
    found = client("autoscaling").describe_scheduled_actions(AutoScalingGroupName=GROUP)
    assert found["ScheduledUpdateGroupActions"] == []


def test_prewarm_schedules_one_window_and_refuses_more_than_max_size(make: Any) -> None:
    run(make())
    at = (datetime.now(timezone.utc) + timedelta(days=1)).replace(second=0, microsecond=0)
    args = ["pool", "prewarm", "--pool", "lab-a/embedder", "--at", at.strftime("%Y-%m-%dT%H:%M"), "--for", "2h"]
    res = CliRunner().invoke(cli, [*args, "--instances", "2", "--json"])
    assert res.exit_code == 0, res.output
    found = client("autoscaling").describe_scheduled_actions(AutoScalingGroupName=GROUP)
    actions = {a["ScheduledActionName"]: a for a in found["ScheduledUpdateGroupActions"]}
    stem = f"calque-prewarm-{at.strftime('%Y%m%dT%H%MZ').lower()}"
    assert actions[f"{stem}-start"]["MinSize"] == 2 and actions[f"{stem}-end"]["MinSize"] == 0
    assert actions[f"{stem}-start"]["StartTime"] == at - timedelta(minutes=10)
    res = CliRunner().invoke(cli, [*args, "--instances", "9"])
    assert res.exit_code != 0 and "above the group's max_size 3" in str(res.exception)
