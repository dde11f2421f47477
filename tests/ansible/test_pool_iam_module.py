"""``calque.gpu.pool_iam`` through real ansible-playbook runs against moto IAM: made, unchanged, checked, removed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from calque.aws.clients import client
from calque.aws.iam_policy import pool_iam_documents
from calque.models.pool_names import pool_names
from support.ansible import PlaybookRun, run_playbook

pytestmark = pytest.mark.slow

BUCKET = "lab-calque-runs"
TASK = "pool_iam"


def _run(tmp_path: Path, moto: str, pool: str, state: str = "present", check: bool = False) -> PlaybookRun:
    task = {"name": TASK, "calque.gpu.pool_iam": {"pool": pool, "bucket": BUCKET, "state": state}}
    defaults = {"group/calque.gpu.aws": {"region": "us-east-1", "endpoint_url": moto}}
    return run_playbook(tmp_path, [task], check=check, diff=check, module_defaults=defaults)


def _role(name: str) -> dict[str, Any] | None:
    iam = client("iam")
    try:
        role: dict[str, Any] = iam.get_role(RoleName=name)["Role"]
    except iam.exceptions.NoSuchEntityException:
        return None
    return role


def test_pool_iam_creates_the_role_policy_and_profile_then_changes_nothing(moto: str, tmp_path: Path) -> None:
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
    made = first.task(TASK)
    assert made["worker_policy"] == docs.worker_policy and made["profile_exists"] is True

    second = _run(tmp_path, moto, "lab-a/embedder")
    assert second.rc == 0, second.stdout + second.stderr
    assert second.changed == 0, [r["task"] for r in second.results if r["result"].get("changed")]


def test_what_widens_the_role_is_taken_back_and_check_mode_says_so_first(moto: str, tmp_path: Path) -> None:
    """A managed policy attached by hand, a second inline policy and a loosened trust: the next run restores
    the rendered role, and check mode before it names each call and makes none."""
    assert _run(tmp_path, moto, "lab-a/embedder").rc == 0
    names, iam = pool_names("lab-a/embedder"), client("iam")
    admin = iam.create_policy(
        PolicyName="by-hand",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        ),
    )["Policy"]["Arn"]
    iam.attach_role_policy(RoleName=names.role, PolicyArn=admin)
    iam.put_role_policy(
        RoleName=names.role,
        PolicyName="extra",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        ),
    )
    check = _run(tmp_path, moto, "lab-a/embedder", check=True)
    assert check.rc == 0, check.stdout
    planned = check.task(TASK)
    assert planned["changed"] is True
    assert iam.list_attached_role_policies(RoleName=names.role)["AttachedPolicies"] != []  # check changed nothing
    real = _run(tmp_path, moto, "lab-a/embedder")
    assert real.rc == 0 and real.task(TASK)["changed"] is True
    assert iam.list_attached_role_policies(RoleName=names.role)["AttachedPolicies"] == []
    assert iam.list_role_policies(RoleName=names.role)["PolicyNames"] == [names.policy]


def test_check_mode_from_nothing_creates_nothing_and_says_the_profile_is_not_there(moto: str, tmp_path: Path) -> None:
    run = _run(tmp_path, moto, "lab-a/embedder", check=True)
    assert run.rc == 0, run.stdout + run.stderr
    planned = run.task(TASK)
    assert planned["changed"] is True and planned["profile_exists"] is False
    assert _role(pool_names("lab-a/embedder").role) is None


def test_removing_one_labs_role_leaves_the_other_labs_role_whole(moto: str, tmp_path: Path) -> None:
    for pool in ("lab-a/embedder", "lab-b/embedder"):
        assert _run(tmp_path, moto, pool).rc == 0
    down = _run(tmp_path, moto, "lab-a/embedder", "absent")
    assert down.rc == 0, down.stdout + down.stderr
    a, b = pool_names("lab-a/embedder"), pool_names("lab-b/embedder")
    assert _role(a.role) is None
    names = [p["InstanceProfileName"] for p in client("iam").list_instance_profiles()["InstanceProfiles"]]
    assert names == [b.instance_profile]
    assert _role(b.role) is not None
    assert client("iam").list_role_policies(RoleName=b.role)["PolicyNames"] == [b.policy]
    again = _run(tmp_path, moto, "lab-a/embedder", "absent")
    assert again.rc == 0 and again.changed == 0, again.stdout


def test_a_role_tagged_for_another_pool_is_neither_adopted_nor_deleted(moto: str, tmp_path: Path) -> None:
    name = pool_names("lab-a/embedder").role
    trust = json.dumps({"Version": "2012-10-17", "Statement": []})
    client("iam").create_role(
        RoleName=name, AssumeRolePolicyDocument=trust, Tags=[{"Key": "calque:pool", "Value": "lab-z/x"}]
    )
    for state in ("present", "absent"):
        run = _run(tmp_path, moto, "lab-a/embedder", state)
        assert run.rc != 0
        assert "tagged calque:pool='lab-z/x', not 'lab-a/embedder'" in run.task(TASK)["msg"], run.stdout
    role = _role(name)
    assert role is not None and json.dumps(role["AssumeRolePolicyDocument"]) == trust
    assert client("iam").list_role_policies(RoleName=name)["PolicyNames"] == []
