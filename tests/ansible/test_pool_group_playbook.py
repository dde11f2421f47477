"""``playbooks/pool.yml`` and ``teardown.yml`` driving a pool's Auto Scaling group on the moto server.

Real ``ansible-playbook`` runs with the sandbox inventory; instance refresh is the strict fake of
tests/support/fake_instance_refresh.py (moto 5.2 lacks it), the rest is moto's Auto Scaling and EC2.
"""

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
SANDBOX = REPO / "playbooks/inventories/sandbox/hosts.yml"
GROUP_TASK = "Pool instances (calque.gpu.pool_group, through the Acquirer)"
SANDBOX_GROUP: dict[str, Any] = {
    "count": 2,
    "max_size": 3,
    "instance_types": ["g6.xlarge"],
    "ami_ssm_parameter": "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
    "ttl": "1h",
}


def play(
    tmp_path: Path, book: str, *args: str, inventory: Path = SANDBOX, **extra: Any
) -> tuple[int, dict[str, dict[str, Any]]]:
    """Run ``book`` with ``inventory`` and ``extra`` as JSON extra vars; rc and each task's result (first host's)."""
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_HOME": str(tmp_path / ".ansible"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / ".ansible-tmp"),
    }
    extra.setdefault("calque_pool_spec_path", str(tmp_path / "spec" / "pool.yml"))
    cmd = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "playbooks" / book)]
    cmd += ["-e", json.dumps(extra), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    doc = json.loads(proc.stdout)
    tasks = {own_name(t): next(iter(t["hosts"].values())) for p in doc["plays"] for t in p["tasks"] if t["hosts"]}
    return proc.returncode, tasks


def own_name(task: dict[str, Any]) -> str:
    """A task's own name: the role's task "calque.gpu.pool : Pool instances ..." is "Pool instances ..."."""
    return str(task["task"]["name"]).split(" : ", 1)[-1]


def in_group(pool: str = "sandbox/embedder") -> list[str]:
    found = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[pool_names(pool).group])
    groups = found["AutoScalingGroups"]
    return sorted(i["InstanceId"] for i in groups[0]["Instances"]) if groups else []


# Raising and lowering the count, and a spec change that rolls: test_pool_check_predicts.py, in one pool's life
# with check mode before each change (its runs were these tests' runs). Two labs' pools of one model side by
# side, and tearing one down: test_pool_teardown.py.


@pytest.mark.slow
def test_check_mode_fails_on_a_missing_security_group_or_instance_profile(moto: str, tmp_path: Path) -> None:
    rc, tasks = play(
        tmp_path,
        "pool.yml",
        "--check",
        calque_pool_group={**SANDBOX_GROUP, "security_groups": ["sg-0123456789abcdef0"]},
    )
    assert rc != 0 and "security group 'sg-0123456789abcdef0' does not exist" in tasks[GROUP_TASK]["msg"]
    rc, tasks = play(
        tmp_path, "pool.yml", "--check", calque_pool_group={**SANDBOX_GROUP, "instance_profile": "no-such-profile"}
    )
    assert rc != 0 and "instance profile 'no-such-profile' does not exist" in tasks[GROUP_TASK]["msg"]
    assert client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"] == []


KNOBS_TASK = "Scaling defaults from the script's Modal knobs, inventory over them"
WARM_SCRIPT = """
import modal

app = modal.App("warm")


@app.cls(gpu="L4", min_containers=1, scaledown_window=600)
class Embedder:
    @modal.method()
    def embed(self, text: str) -> list[float]:
        return [float(len(text))]
"""


@pytest.mark.slow
def test_pool_yml_warms_a_pool_from_the_scripts_knobs_changes_nothing_twice_and_teardown_removes_it(
    moto: str, tmp_path: Path
) -> None:
    from calque.aws.acquire.scaling import policy_names
    from calque.aws.acquire.warm_pool import LAUNCH_HOOK

    script = tmp_path / "warm.py"
    script.write_text(WARM_SCRIPT)
    group = {k: v for k, v in SANDBOX_GROUP.items() if k != "count"}
    extra: dict[str, Any] = {
        "calque_pool_workload": f"{script}::Embedder",
        "calque_pool_group": {**group, "count": 1, "market": "on-demand"},
        "calque_pool_warm": {"state": "Stopped", "min_size": 1},
    }
    rc, tasks = play(tmp_path, "pool.yml", "--diff", **extra)
    assert rc == 0, tasks
    knobs = tasks[KNOBS_TASK]
    assert knobs["min_size"] == {"value": 1, "source": "script: min_containers=1 on Embedder"}
    assert knobs["idle_s"] == {"value": 600, "source": "script: scaledown_window=600 on Embedder"}
    assert knobs["max_size"]["source"] == "inventory (calque_pool_group.max_size)"
    assert knobs["diff"]["after"]["min_size"] == "1 (script: min_containers=1 on Embedder)"  # --diff says whence
    names = pool_names("sandbox/embedder")
    asg = client("autoscaling")
    assert asg.describe_auto_scaling_groups(AutoScalingGroupNames=[names.group])["AutoScalingGroups"][0]["MinSize"] == 1
    idle = client("cloudwatch").describe_alarms(AlarmNames=[policy_names(names)[2]])["MetricAlarms"][0]
    assert idle["EvaluationPeriods"] == 10  # scaledown_window 600 s in CloudWatch's 1-minute periods
    warm = asg.describe_warm_pool(AutoScalingGroupName=names.group)["WarmPoolConfiguration"]
    assert warm["PoolState"] == "Stopped" and warm["MinSize"] == 1
    hooks = asg.describe_lifecycle_hooks(AutoScalingGroupName=names.group)["LifecycleHooks"]
    assert {h["LifecycleHookName"]: h["LifecycleTransition"] for h in hooks}[LAUNCH_HOOK].endswith("LAUNCHING")

    rc, tasks = play(tmp_path, "pool.yml", **extra)
    assert rc == 0 and [name for name, t in tasks.items() if t.get("changed")] == []  # changed=0

    rc, tasks = play(tmp_path, "pool.yml", "--check", "--diff", **{**extra, "calque_pool_warm": {"min_size": 2}})
    planned = tasks[GROUP_TASK]
    assert rc == 0 and planned["changed"] and planned["rolling"] == []  # a diff, no roll
    assert (
        planned["diff"]["before"]["warm_pool"]["MinSize"] == 1 and planned["diff"]["after"]["warm_pool"]["MinSize"] == 2
    )
    assert planned["diff"]["before"]["config"] == planned["diff"]["after"]["config"]

    rc, _ = play(tmp_path, "teardown.yml", **extra)
    assert rc == 0 and asg.describe_auto_scaling_groups(AutoScalingGroupNames=[names.group])["AutoScalingGroups"] == []
