"""calque.gpu.ec2_cohort through real ansible-playbook against the moto server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.ansible import run_playbook

from .conftest import AL2023, Network

pytestmark = pytest.mark.slow


def cohort_task(name: str, network: Network, **options: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "name": "mod-lab",
        "count": 2,
        "instance_types": ["g6.xlarge", "g6e.xlarge"],
        "subnets": network.subnets,
        "ami_ssm_parameter": AL2023,
        "ttl": "2h",
        "wait_timeout": 30,
    }
    args.update(options)
    task: dict[str, Any] = {"name": name, "calque.gpu.ec2_cohort": args, "ignore_errors": True}
    return task


def defaults(moto: str) -> dict[str, Any]:
    return {"module_defaults": {"group/calque.gpu.aws": {"endpoint_url": moto, "region": "us-east-1"}}}


def live_ids(ec2: Any) -> list[str]:
    res = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return sorted(i["InstanceId"] for r in res["Reservations"] for i in r["Instances"])


def test_check_mode_diff_apply_idempotence_scale_down_and_absent(
    tmp_path: Path, moto: str, ec2: Any, network: Network
) -> None:
    spend = {"i_understand_this_spends_money": True}
    tasks = [
        {**cohort_task("plan", network, **spend), "check_mode": True, "diff": True},
        {**cohort_task("apply", network, tags={"lab": "bio", "year": 2026}, **spend), "diff": True},
        cohort_task("again", network, **spend),
        cohort_task("down without consent", network, count=1),
        {**cohort_task("down", network, count=1, i_understand_this_terminates_instances=True), "diff": True},
        {**cohort_task("gone", network, state="absent", i_understand_this_terminates_instances=True)},
        cohort_task("gone again", network, state="absent", i_understand_this_terminates_instances=True),
    ]
    tasks = [{**t, **defaults(moto)} for t in tasks]
    run = run_playbook(tmp_path, tasks)

    plan = run.task("plan")
    assert plan["changed"] and plan["plan"]["launch"] == 2 and plan["launched"] == []
    assert plan["hourly_usd"] == pytest.approx(2 * 1.861)  # the dearest listed type, as the gate prices it
    assert plan["diff"]["before"]["count"] == 0 and plan["diff"]["after"]["count"] == 2

    applied = run.task("apply")
    assert applied["changed"] and len(applied["launched"]) == 2 and len(applied["instances"]) == 2
    assert applied["hourly_usd"] == pytest.approx(2 * 0.8048)
    assert {i["instance_type"] for i in applied["instances"]} == {"g6.xlarge"}
    assert applied["diff"]["after"]["count"] == 2
    assert all(i["expires_at"] and i["availability_zone"].startswith("us-east-1") for i in applied["instances"])
    first = ec2.describe_instances(InstanceIds=[applied["launched"][0]])["Reservations"][0]["Instances"][0]
    tags = {t["Key"]: t["Value"] for t in first["Tags"]}
    assert tags["year"] == "2026" and tags["calque:cohort"] == "mod-lab"

    again = run.task("again")
    assert again["changed"] is False and again["launched"] == []

    refused = run.task("down without consent")
    assert refused.get("failed") and "i_understand_this_terminates_instances" in refused["msg"]
    assert refused["calque_exit_code"] == 4

    down = run.task("down")
    assert down["changed"] and len(down["terminated"]) == 1 and down["diff"]["after"]["count"] == 1

    gone = run.task("gone")
    assert gone["changed"] and len(gone["terminated"]) == 1
    assert run.task("gone again")["changed"] is False
    assert live_ids(ec2) == []


def test_spend_gate_in_the_module(tmp_path: Path, moto: str, ec2: Any, network: Network) -> None:
    # the endpoint comes only from module_defaults here: a run that ignored them would refuse offline
    env = {"AWS_ENDPOINT_URL": ""}
    tasks = [
        cohort_task("no consent", network),
        cohort_task("too dear", network, count=4, max_hourly_usd=5, i_understand_this_spends_money=True),
    ]
    run = run_playbook(tmp_path, [{**t, **defaults(moto)} for t in tasks], extra_env=env)
    no = run.task("no consent")
    assert no["failed"] and "i_understand_this_spends_money: true" in no["msg"] and no["calque_exit_code"] == 4
    dear = run.task("too dear")
    assert dear["failed"] and "4 x g6e.xlarge at $1.8610/h = $7.44/h > max_hourly_usd $5.00/h" in dear["msg"]
    assert live_ids(ec2) == []


def test_bad_input_says_what_to_change(tmp_path: Path, moto: str, ec2: Any, network: Network) -> None:
    tasks = [
        cohort_task("empty types", network, instance_types=[]),
        cohort_task("min over count", network, count=2, min_viable=3),
        cohort_task("unknown market", network, market="reserved"),
        cohort_task("unknown type", network, instance_types=["g6.nano"], i_understand_this_spends_money=True),
        cohort_task("bad ttl", network, ttl="three hours"),
    ]
    run = run_playbook(tmp_path, [{**t, **defaults(moto)} for t in tasks])
    assert "list at least one EC2 instance type" in run.task("empty types")["msg"]
    assert "min_viable (3) is more than count (2)" in run.task("min over count")["msg"]
    market = run.task("unknown market")["msg"]
    assert "market" in market and "spot-then-on-demand" in market
    assert "known g6 types: " in run.task("unknown type")["msg"]
    assert "ttl='three hours'" in run.task("bad ttl")["msg"] and "change ttl" in run.task("bad ttl")["msg"]
    assert all(r["result"].get("failed") for r in run.results)
    assert live_ids(ec2) == []
