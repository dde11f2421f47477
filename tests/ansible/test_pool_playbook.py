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
    tasks = {t["task"]["name"]: t["hosts"]["localhost"] for p in doc["plays"] for t in p["tasks"]}
    return proc.returncode, tasks, proc.stderr


def instances() -> list[str]:
    res = client("ec2").describe_instances()
    return [i["InstanceId"] for r in res["Reservations"] for i in r["Instances"]]


@pytest.mark.slow
def test_check_mode_plans_the_pool_and_creates_nothing(moto: str, tmp_path: Path) -> None:
    rc, tasks, err = pool_playbook(tmp_path, "--check")
    assert rc == 0, err
    cohort = tasks["Pool instances (calque.gpu.ec2_cohort, through the Acquirer)"]
    assert cohort["changed"] and cohort["plan"]["launch"] == 2
    assert "g6.xlarge" in cohort["plan"]["spend"] and "max_hourly_usd $5.00/h" in cohort["plan"]["spend"]
    spec = tasks["Pool spec file, staged calque runtime and worker user-data"]
    assert "calque pool worker --spec /etc/calque/pool.yml" in spec["user_data"]
    assert spec["runtime"]["url"] is None and spec["runtime"]["uploaded"] is False  # check mode uploads nothing
    assert instances() == []
    assert client("sqs").list_queues().get("QueueUrls", []) == []
    assert client("s3").list_buckets()["Buckets"] == []
    assert not (tmp_path / "spec" / "pool.yml").exists()


@pytest.mark.slow
def test_without_spend_consent_the_cohort_is_refused_and_nothing_launches(moto: str, tmp_path: Path) -> None:
    rc, tasks, _ = pool_playbook(tmp_path, "-e", "calque_i_understand_this_spends_money=false")
    assert rc != 0
    cohort = tasks["Pool instances (calque.gpu.ec2_cohort, through the Acquirer)"]
    assert cohort["failed"] and "i_understand_this_spends_money: true" in cohort["msg"]
    assert instances() == []
    # what came before the gate is in place: the spec the workers would read names the staged script
    spec = (tmp_path / "spec" / "pool.yml").read_text()
    assert "workload: s3://calque-sandbox-runs/calque/pools/calque-pool-sandbox-embedder-" in spec
    # the runtime: this calque's wheel staged in the bucket, its presigned URL and sha256 in the user-data
    staged = tasks["Pool spec file, staged calque runtime and worker user-data"]
    assert staged["changed"]
    info = staged["runtime"]
    assert info["uploaded"] is True
    head = client("s3").head_object(Bucket="calque-sandbox-runs", Key=info["key"])
    assert info["key"] == "calque/runtime/calque-0.1.0-py3-none-any.whl"
    assert head["Metadata"]["calque-sha256"] == info["sha256"]
    user_data = staged["user_data"]
    assert f"RUNTIME_SHA256={info['sha256']}\n" in user_data and "RUNTIME_URL='http://127.0.0.1:" in user_data
    assert info["wheelhouse_key"] is None and "WHEELHOUSE_URL=''" in user_data  # the sandbox stages the wheel alone
    # a second run stages the identical wheel and finds the same spec file: no upload, no change
    rc, tasks, _ = pool_playbook(tmp_path, "-e", "calque_i_understand_this_spends_money=false")
    again = tasks["Pool spec file, staged calque runtime and worker user-data"]
    assert not again["changed"] and again["runtime"]["sha256"] == info["sha256"] and not again["runtime"]["uploaded"]
