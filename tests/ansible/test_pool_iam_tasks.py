"""``playbooks/tasks/pool_iam.yml`` and its teardown through real ansible-playbook runs against moto IAM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from calque.aws.clients import client
from calque.aws.iam_policy import pool_iam_documents
from calque.models.pool_names import pool_names
from support.ansible import REPO, PlaybookRun, run_playbook

pytestmark = pytest.mark.slow

TASKS = REPO / "playbooks" / "tasks"
BUCKET = "lab-calque-runs"


def _run(tmp_path: Path, moto: str, pool: str, file: str = "pool_iam.yml", check: bool = False) -> PlaybookRun:
    play_vars: dict[str, Any] = {
        "calque_pool_name": pool,
        "calque_pool_bucket": BUCKET,
        "calque_aws_region": "us-east-1",
    }
    include = {"name": f"include {file}", "ansible.builtin.include_tasks": str(TASKS / file)}
    defaults = {"group/calque.gpu.aws": {"region": "us-east-1", "endpoint_url": moto}}
    return run_playbook(tmp_path, [include], check=check, play_vars=play_vars, module_defaults=defaults)


def _role(name: str) -> dict[str, Any] | None:
    iam = client("iam")
    try:
        role: dict[str, Any] = iam.get_role(RoleName=name)["Role"]
    except iam.exceptions.NoSuchEntityException:
        return None
    return role


def test_pool_iam_tasks_create_the_role_policy_and_profile_then_change_nothing(moto: str, tmp_path: Path) -> None:
    first = _run(tmp_path, moto, "lab-a/embedder")
    assert first.rc == 0, first.stdout + first.stderr
    docs = pool_iam_documents("lab-a/embedder", bucket=BUCKET, region="us-east-1", account="123456789012")
    iam = client("iam")
    role = _role(docs.role_name)
    assert role is not None and role["AssumeRolePolicyDocument"] == docs.trust_policy
    assert {t["Key"]: t["Value"] for t in role.get("Tags", [])} == {"calque:pool": "lab-a/embedder"}
    assert iam.list_role_policies(RoleName=docs.role_name)["PolicyNames"] == [docs.policy_name]
    inline = iam.get_role_policy(RoleName=docs.role_name, PolicyName=docs.policy_name)["PolicyDocument"]
    assert inline == docs.worker_policy
    assert iam.list_attached_role_policies(RoleName=docs.role_name)["AttachedPolicies"] == []
    profile = iam.get_instance_profile(InstanceProfileName=docs.instance_profile_name)["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == [docs.role_name]
    assert first.task("The pool's IAM names and documents")["worker_policy"] == docs.worker_policy

    second = _run(tmp_path, moto, "lab-a/embedder")
    assert second.rc == 0, second.stdout + second.stderr
    assert second.changed == 0, [r["task"] for r in second.results if r["result"].get("changed")]


def test_check_mode_from_nothing_creates_nothing(moto: str, tmp_path: Path) -> None:
    run = _run(tmp_path, moto, "lab-a/embedder", check=True)
    assert run.rc == 0, run.stdout + run.stderr
    assert run.task("Workers' role (EC2 may assume it)")["changed"] is True
    assert _role(pool_names("lab-a/embedder").role) is None


def test_teardown_of_one_lab_leaves_the_other_labs_role_whole(moto: str, tmp_path: Path) -> None:
    for pool in ("lab-a/embedder", "lab-b/embedder"):
        assert _run(tmp_path, moto, pool).rc == 0
    down = _run(tmp_path, moto, "lab-a/embedder", "pool_iam_teardown.yml")
    assert down.rc == 0, down.stdout + down.stderr
    a, b = pool_names("lab-a/embedder"), pool_names("lab-b/embedder")
    assert _role(a.role) is None
    names = [p["InstanceProfileName"] for p in client("iam").list_instance_profiles()["InstanceProfiles"]]
    assert names == [b.instance_profile]
    assert _role(b.role) is not None
    assert client("iam").list_role_policies(RoleName=b.role)["PolicyNames"] == [b.policy]
    again = _run(tmp_path, moto, "lab-a/embedder", "pool_iam_teardown.yml")
    assert again.rc == 0 and again.changed == 0, again.stdout


def test_a_role_tagged_for_another_pool_is_neither_adopted_nor_deleted(moto: str, tmp_path: Path) -> None:
    name = pool_names("lab-a/embedder").role
    trust = json.dumps({"Version": "2012-10-17", "Statement": []})
    client("iam").create_role(
        RoleName=name, AssumeRolePolicyDocument=trust, Tags=[{"Key": "calque:pool", "Value": "lab-z/x"}]
    )
    for file in ("pool_iam.yml", "pool_iam_teardown.yml"):
        run = _run(tmp_path, moto, "lab-a/embedder", file)
        assert run.rc != 0
        assert "tagged calque:pool for another pool" in run.stdout, run.stdout
    role = _role(name)
    assert role is not None and json.dumps(role["AssumeRolePolicyDocument"]) == trust
    assert client("iam").list_role_policies(RoleName=name)["PolicyNames"] == []
