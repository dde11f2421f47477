"""``playbooks/pool.yml`` with the sandbox inventory against the moto server: check mode, the spend gate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from calque.aws.clients import client
from calque.models.pool_names import pool_names

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def pool_playbook(tmp_path: Path, *args: str) -> tuple[int, dict[str, dict[str, Any]], str]:
    """Run pool.yml with the JSON callback; the rc, each task's localhost result by name, stderr."""
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_HOME": str(tmp_path / ".ansible"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / ".ansible-tmp"),
    }
    cmd = [str(BIN / "ansible-playbook"), "-i", str(REPO / "playbooks/inventories/sandbox/hosts.yml")]
    cmd += [str(REPO / "playbooks/pool.yml"), "-e", f"calque_pool_spec_path={tmp_path / 'spec' / 'pool.yml'}", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    doc = json.loads(proc.stdout)
    tasks = {t["task"]["name"]: t["hosts"]["localhost"] for p in doc["plays"] for t in p["tasks"]}
    return proc.returncode, tasks, proc.stderr


def instances() -> list[str]:
    res = client("ec2").describe_instances()
    return [i["InstanceId"] for r in res["Reservations"] for i in r["Instances"]]


GROUP_TASK = "Pool instances (calque.gpu.pool_group, through the Acquirer)"
GATE_TASK = "Spend gate (worst case, consents) before anything is made"
SPEC_TASK = "Staged calque runtime and worker user-data"


def changed_tasks(tasks: dict[str, dict[str, Any]]) -> list[str]:
    return sorted(name for name, res in tasks.items() if res.get("changed"))


@pytest.mark.slow
def test_check_mode_plans_the_pool_and_creates_nothing(moto: str, tmp_path: Path) -> None:
    rc, tasks, err = pool_playbook(tmp_path, "--check")
    assert rc == 0, err
    group = tasks[GROUP_TASK]
    assert group["changed"] and group["desired"] == 2 and group["max_size"] == 3
    assert "3 x g6.xlarge" in group["spend"] and "max_hourly_usd $5.00/h" in group["spend"]
    spec = tasks[SPEC_TASK]
    assert "python -m calque.pool.worker --spec /etc/calque/pool.yml" in spec["user_data"]
    # check mode uploads nothing: it built the wheel locally and signed its URL locally (no bucket yet)
    assert spec["runtime"]["uploaded"] is False and spec["runtime"]["url"].startswith("http://127.0.0.1:")
    assert spec["runtime"]["wheelhouse_sha256"] is None  # its wheelhouse: built (and known) only by the real run
    assert instances() == []
    assert client("sqs").list_queues().get("QueueUrls", []) == []
    assert client("s3").list_buckets()["Buckets"] == []
    assert client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"] == []
    assert not (tmp_path / "spec" / "pool.yml").exists()


@pytest.mark.slow
def test_the_spend_gate_refuses_before_the_bucket_or_queue_exist(moto: str, tmp_path: Path) -> None:
    rc, tasks, _ = pool_playbook(tmp_path, "-e", "calque_i_understand_this_spends_money=false")
    assert rc != 0
    gate = tasks[GATE_TASK]
    assert gate["failed"] and "calque_i_understand_this_spends_money: true (inventory" in gate["msg"]
    rc, tasks, _ = pool_playbook(tmp_path, "-e", "calque_max_hourly_usd=1")
    assert rc != 0 and "3 x g6.xlarge" in tasks[GATE_TASK]["msg"] and "max_hourly_usd" in tasks[GATE_TASK]["msg"]
    assert instances() == []
    assert client("sqs").list_queues().get("QueueUrls", []) == []
    assert client("s3").list_buckets()["Buckets"] == []


@pytest.mark.slow
def test_from_nothing_pool_yml_makes_template_group_queue_and_bucket_and_a_second_run_changes_nothing(
    moto: str, tmp_path: Path
) -> None:
    rc, tasks, err = pool_playbook(tmp_path)
    assert rc == 0, err
    group = tasks[GROUP_TASK]
    assert group["changed"] and group["template_version"] == 1 and len(group["instances"]) == 2
    names = pool_names("sandbox/embedder")
    assert client("ec2").describe_launch_templates(LaunchTemplateNames=[names.template])["LaunchTemplates"]
    asg = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[names.group])["AutoScalingGroups"]
    assert asg and {t["Key"]: t["Value"] for t in asg[0]["Tags"]}["calque:pool"] == "sandbox/embedder"
    queue_url = client("sqs").get_queue_url(QueueName=names.queue)["QueueUrl"]
    assert client("sqs").list_queue_tags(QueueUrl=queue_url)["Tags"]["calque:pool"] == "sandbox/embedder"
    # the workers' own role, its one inline policy and its instance profile, on the group's template
    iam = client("iam")
    assert iam.list_role_policies(RoleName=names.role)["PolicyNames"] == [names.policy]
    profile = iam.get_instance_profile(InstanceProfileName=names.instance_profile)["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == [names.role]
    # scaling on the queue: target tracking on backlog per instance, the wake and idle steps, the drain hook
    autoscaling = client("autoscaling")
    policies = autoscaling.describe_policies(AutoScalingGroupName=names.group)["ScalingPolicies"]
    kinds = sorted((p["PolicyName"].rsplit("-", 1)[-1], p["PolicyType"]) for p in policies)
    assert kinds == [("backlog", "TargetTrackingScaling"), ("idle", "StepScaling"), ("wake", "StepScaling")]
    hooks = autoscaling.describe_lifecycle_hooks(AutoScalingGroupName=names.group)["LifecycleHooks"]
    assert [h["LifecycleTransition"] for h in hooks] == ["autoscaling:EC2_INSTANCE_TERMINATING"]
    # the spec the workers read names the pool, its queue and the staged script
    spec = (tmp_path / "spec" / "pool.yml").read_text()
    assert "pool: sandbox/embedder" in spec and f"queue_name: {names.queue}" in spec
    assert f"workload: s3://calque-sandbox-runs/calque/pools/{names.queue}/" in spec
    # the runtime: this calque's wheel staged in the bucket, its presigned URL and sha256 in the user-data
    info = tasks[SPEC_TASK]["runtime"]
    assert info["uploaded"] is True and info["key"] == "calque/runtime/calque-0.1.0-py3-none-any.whl"
    head = client("s3").head_object(Bucket="calque-sandbox-runs", Key=info["key"])
    assert head["Metadata"]["calque-sha256"] == info["sha256"]
    user_data = tasks[SPEC_TASK]["user_data"]
    assert f"RUNTIME_SHA256={info['sha256']}\n" in user_data and "RUNTIME_URL='http://127.0.0.1:" in user_data
    # a second run: the same wheel, spec, template and group (a fresh presigned URL alone rolls nothing)
    rc, tasks, err = pool_playbook(tmp_path)
    assert rc == 0, err
    assert changed_tasks(tasks) == []
    rc, tasks, err = pool_playbook(tmp_path, "--check", "--diff")
    assert rc == 0, err
    assert changed_tasks(tasks) == [] and tasks[GROUP_TASK]["rolling"] == []
