"""``playbooks/pool.yml`` with the sandbox inventory against the moto server: check mode, the spend gate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from calque.aws.clients import client
from test_checkout_config import SANDBOX, bare_env

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


@dataclass(frozen=True)
class CheckRun:
    """One ``pool.yml --check`` on a clean moto, and what moto and the disk held right after it."""

    rc: int
    tasks: dict[str, dict[str, Any]]
    stats: dict[str, int]
    output: str
    spec_written: bool
    instances: list[str]
    queues: list[str]
    buckets: list[dict[str, Any]]
    groups: list[dict[str, Any]]


@pytest.fixture(scope="module")
def _check_runs() -> dict[str, CheckRun]:
    return {}


@pytest.fixture
def sandbox_check(moto: str, tmp_path_factory: pytest.TempPathFactory, _check_runs: dict[str, CheckRun]) -> CheckRun:
    """``pool.yml --check`` with the sandbox inventory as a fresh checkout runs it (from the repository root, no
    ANSIBLE_COLLECTIONS_PATH or ANSIBLE_CONFIG: the repository's ansible.cfg finds calque.gpu), with the JSON
    callback. Run once, by the module's first test that asks (on a clean moto: ``moto``), for the two tests below
    that read different things of the same run (conftest.py keeps this module on one worker)."""
    if "run" not in _check_runs:
        tmp = tmp_path_factory.mktemp("sandbox-check")
        spec = tmp / "spec" / "pool.yml"
        env = {**bare_env(tmp), "ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_LOCALHOST_WARNING": "false"}
        cmd = [str(BIN / "ansible-playbook"), "-i", SANDBOX, "playbooks/pool.yml", "--check", "-e"]
        cmd.append(f"calque_pool_spec_path={spec}")
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        doc = json.loads(proc.stdout)
        _check_runs["run"] = CheckRun(
            rc=proc.returncode,
            tasks={
                t["task"]["name"].split(" : ", 1)[-1]: t["hosts"]["localhost"] for p in doc["plays"] for t in p["tasks"]
            },
            stats=doc["stats"]["localhost"],
            output=proc.stdout + proc.stderr,
            spec_written=spec.exists(),
            instances=instances(),
            queues=client("sqs").list_queues().get("QueueUrls", []),
            buckets=client("s3").list_buckets()["Buckets"],
            groups=client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"],
        )
    return _check_runs["run"]


GROUP_TASK = "Pool instances (calque.gpu.pool_group, through the Acquirer)"
GATE_TASK = "Spend gate (worst case, consents) before anything is made"
SPEC_TASK = "Staged calque runtime and worker user-data"


@pytest.mark.slow
def test_check_mode_plans_the_pool_and_creates_nothing(sandbox_check: CheckRun) -> None:
    assert sandbox_check.rc == 0, sandbox_check.output
    group = sandbox_check.tasks[GROUP_TASK]
    assert group["changed"] and group["desired"] == 2 and group["max_size"] == 3
    assert "3 x g6.xlarge" in group["spend"] and "max_hourly_usd $5.00/h" in group["spend"]
    spec = sandbox_check.tasks[SPEC_TASK]
    assert "python -m calque.pool.worker --spec /etc/calque/pool.yaml" in spec["user_data"]
    # check mode uploads nothing: it built the wheel locally and signed its URL locally (no bucket yet)
    assert spec["runtime"]["uploaded"] is False and spec["runtime"]["url"].startswith("http://127.0.0.1:")
    assert spec["runtime"]["wheelhouse_sha256"] is None  # its wheelhouse: built (and known) only by the real run
    assert sandbox_check.instances == []
    assert sandbox_check.queues == []
    assert sandbox_check.buckets == []
    assert sandbox_check.groups == []
    assert not sandbox_check.spec_written


# (From test_checkout_config.py, whose runs all drop the environment: it reads the same check run as the test above.)
@pytest.mark.slow
def test_sandbox_pool_plays_in_check_mode_with_no_environment(sandbox_check: CheckRun) -> None:
    assert sandbox_check.rc == 0, sandbox_check.output
    assert sandbox_check.stats["ok"] > 0 and sandbox_check.stats["failures"] == 0
    assert not sandbox_check.spec_written  # check mode wrote nothing


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
