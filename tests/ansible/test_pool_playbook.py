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
    # by the task's own name: "calque.gpu.pool : Pool queue ..." is the role's task "Pool queue ..."
    tasks = {t["task"]["name"].split(" : ", 1)[-1]: t["hosts"]["localhost"] for p in doc["plays"] for t in p["tasks"]}
    return proc.returncode, tasks, proc.stderr


def instances() -> list[str]:
    res = client("ec2").describe_instances()
    return [i["InstanceId"] for r in res["Reservations"] for i in r["Instances"]]


GROUP_TASK = "Pool instances (calque.gpu.pool_group, through the Acquirer)"
GATE_TASK = "Spend gate (worst case, consents) before anything is made"
SPEC_TASK = "Staged calque runtime and worker user-data"


@pytest.mark.slow
def test_check_mode_plans_the_pool_and_creates_nothing(moto: str, tmp_path: Path) -> None:
    rc, tasks, err = pool_playbook(tmp_path, "--check")
    assert rc == 0, err
    group = tasks[GROUP_TASK]
    assert group["changed"] and group["desired"] == 2 and group["max_size"] == 3
    assert "3 x g6.xlarge" in group["spend"] and "max_hourly_usd $5.00/h" in group["spend"]
    spec = tasks[SPEC_TASK]
    assert "python -m calque.pool.worker --spec /etc/calque/pool.yaml" in spec["user_data"]
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


# Made from nothing, then a second run that changes nothing and a check that predicts nothing: the first
# runs of test_pool_check_predicts.py's pool (made_from_nothing), which asserts all of it.
