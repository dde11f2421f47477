"""``playbooks/session_fleet.yml`` against the moto server: from nothing, check mode, twice, teardown.

A teaching class (tests/ansible/data/session_fleet_vars.yml) gets its launch template, group, the
hosts' role, inline policy and instance profile, the demand and idle policies and alarms, the drain
hook and the scheduled capacity; a second run changes nothing; teardown drains and deletes. moto
stores the policies and alarms and never runs them (docs/session-fleet.md): what they do is
tests/acquire/test_fleet_scaling.py's and bench/session_fleet.py's.
"""

from __future__ import annotations

import base64
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
VARS = Path(__file__).parent / "data" / "session_fleet_vars.yml"
NAMES = pool_names("fleet/teaching-rtx6000")


def fleet_playbook(tmp_path: Path, *args: str) -> tuple[int, list[tuple[str, dict[str, Any]]], str]:
    """Run session_fleet.yml with the JSON callback: the rc, (task name, localhost result) in order, stderr."""
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_HOME": str(tmp_path / ".ansible"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / ".ansible-tmp"),
    }
    cmd = [str(BIN / "ansible-playbook"), "-i", str(REPO / "playbooks/inventories/sandbox/hosts.yml")]
    cmd += [str(REPO / "playbooks/session_fleet.yml"), "-e", f"@{VARS}", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"no JSON from ansible-playbook (rc {proc.returncode}): {proc.stderr[-2000:]}")
    tasks = [(t["task"]["name"], t["hosts"]["localhost"]) for p in doc["plays"] for t in p["tasks"]]
    failed = [f"{n}: {r.get('msg')}" for n, r in tasks if r.get("failed")]
    return proc.returncode, tasks, "\n".join(failed) or proc.stderr[-2000:]


def task(tasks: list[tuple[str, dict[str, Any]]], prefix: str) -> dict[str, Any]:
    found = [r for n, r in tasks if n.split(" : ", 1)[-1].startswith(prefix) and not r.get("skipped")]
    assert found, f"no task {prefix!r} ran: {[n for n, _ in tasks]}"
    return found[-1]


def changed(tasks: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [n for n, r in tasks if r.get("changed")]


def group() -> dict[str, Any] | None:
    found = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[NAMES.group])
    return next(iter(found["AutoScalingGroups"]), None)


@pytest.mark.slow
def test_session_fleet_from_nothing_check_twice_and_teardown(moto: str, tmp_path: Path) -> None:
    client("ssm").put_parameter(
        Name="/calque/institution/munge-key", Type="SecureString", Value=base64.b64encode(b"k" * 64).decode()
    )
    # check mode from nothing: the plan, and nothing made
    rc, tasks, err = fleet_playbook(tmp_path, "--check")
    assert rc == 0, err
    planned = task(tasks, "Class | Launch template and Auto Scaling group")
    assert planned["changed"] and (planned["min_size"], planned["max_size"], planned["desired"]) == (0, 4, 0)
    assert "4 x g7e.2xlarge" in planned["spend"]
    scaling = task(tasks, "Class | Scaling on the broker's demand")
    assert scaling["changed"] and scaling["alarms"] == [f"{NAMES.base}-demand", f"{NAMES.base}-idle"]
    user_data = task(tasks, "Class | Staged runtime")["user_data"]
    assert 'session fleet register --class "$CLASS" --offers 1g.24gb' in user_data
    assert "--ssm-parameter /calque/institution/munge-key" in user_data
    assert group() is None and client("iam").list_roles()["Roles"] == []
    assert client("cloudwatch").describe_alarms()["MetricAlarms"] == []

    # the real run makes every part
    rc, tasks, err = fleet_playbook(tmp_path)
    assert rc == 0, err
    g = group()
    assert g is not None and (g["MinSize"], g["MaxSize"]) == (0, 4)
    assert {"Key": "calque:pool", "Value": "fleet/teaching-rtx6000"} in [
        {"Key": t["Key"], "Value": t["Value"]} for t in g["Tags"]
    ]
    templates = client("ec2").describe_launch_templates(LaunchTemplateNames=[NAMES.template])["LaunchTemplates"]
    assert len(templates) == 1
    role = client("iam").get_role(RoleName=NAMES.role)["Role"]
    doc = client("iam").get_role_policy(RoleName=NAMES.role, PolicyName=NAMES.policy)["PolicyDocument"]
    doc = json.loads(doc) if isinstance(doc, str) else doc
    sids = {s["Sid"]: s for s in doc["Statement"]}
    assert sids["MungeKeyOnly"]["Resource"].endswith(":parameter/calque/institution/munge-key")
    assert sids["MungeKeyOnly"]["Action"] == ["ssm:GetParameter"]
    assert set(sids) == {"MungeKeyOnly", "OwnRegistration", "ClassGroupOnly", "FindOwnGroup"}
    assert role["RoleName"] == NAMES.role
    profile = client("iam").get_instance_profile(InstanceProfileName=NAMES.instance_profile)["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == [NAMES.role]
    asg = client("autoscaling")
    policies = {p["PolicyName"]: p for p in asg.describe_policies(AutoScalingGroupName=NAMES.group)["ScalingPolicies"]}
    assert set(policies) == {f"{NAMES.base}-demand", f"{NAMES.base}-idle"}
    steps = policies[f"{NAMES.base}-demand"]["StepAdjustments"]
    assert [s["ScalingAdjustment"] for s in steps] == list(range(1, 11))  # a host per 4 unserved, 10 at most
    alarms = {a["AlarmName"]: a for a in client("cloudwatch").describe_alarms()["MetricAlarms"]}
    demand = alarms[f"{NAMES.base}-demand"]
    assert (demand["Namespace"], demand["MetricName"]) == ("calque/session", "UnservedRequests")
    assert demand["Dimensions"] == [{"Name": "Class", "Value": "teaching-rtx6000"}]
    assert alarms[f"{NAMES.base}-idle"]["EvaluationPeriods"] == 20  # idle_s 1200 in minutes
    hooks = asg.describe_lifecycle_hooks(AutoScalingGroupName=NAMES.group)["LifecycleHooks"]
    assert [(h["LifecycleHookName"], h["HeartbeatTimeout"]) for h in hooks] == [("calque-drain", 600)]
    actions = asg.describe_scheduled_actions(AutoScalingGroupName=NAMES.group)["ScheduledUpdateGroupActions"]
    assert {a["Recurrence"] for a in actions} >= {"15 8 * * 1-5"}  # 08:30 less the 15 minutes' lead
    assert any(a.get("MinSize") == 4 for a in actions)

    # a second run changes nothing
    rc, tasks, err = fleet_playbook(tmp_path)
    assert rc == 0, err
    assert changed(tasks) == []

    # teardown: alarms and policies, the group drained and deleted with its template, the role
    rc, tasks, err = fleet_playbook(tmp_path, "-e", "calque_session_fleet_state=absent")
    assert rc == 0, err
    assert group() is None
    assert client("cloudwatch").describe_alarms()["MetricAlarms"] == []
    assert client("ec2").describe_launch_templates()["LaunchTemplates"] == []
    assert client("iam").list_roles()["Roles"] == []
    assert client("iam").list_instance_profiles()["InstanceProfiles"] == []
