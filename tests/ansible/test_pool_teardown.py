"""``playbooks/teardown.yml`` over an inventory of two labs' pools of one model: one pool per run unless told
otherwise, and tearing one lab's down (queue, bucket, template, role) leaves the other's whole."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from calque.aws.clients import client
from calque.models.pool_names import pool_names
from test_pool_group_playbook import REPO, in_group, play

TEARDOWN_GUARD = "Refuse to tear down more than one pool unless told to"
LABS = ("lab-a", "lab-b")


def two_labs_inventory(tmp_path: Path) -> Path:
    """The sandbox's variables, and a controller entry per lab wearing that lab's pool (as the institution's)."""
    inv = tmp_path / "labs"
    (inv / "group_vars").mkdir(parents=True)
    shutil.copy(REPO / "playbooks/inventories/sandbox/group_vars/all.yml", inv / "group_vars" / "all.yml")
    hosts = {
        lab: {
            "ansible_connection": "local",
            "ansible_python_interpreter": "{{ ansible_playbook_python }}",
            "calque_pool_name": f"{lab}/embedder",
            "calque_pool_bucket": f"{lab}-calque-runs",
            "calque_pool_spec_path": str(tmp_path / lab / "pool.yml"),
        }
        for lab in LABS
    }
    (inv / "hosts.yml").write_text(yaml.safe_dump({"calque_controller": {"hosts": hosts}}))
    return inv / "hosts.yml"


@pytest.mark.slow
def test_teardown_refuses_two_pools_without_a_limit_or_calque_teardown_all_pools(moto: str, tmp_path: Path) -> None:
    inventory = two_labs_inventory(tmp_path)
    rc, _ = play(tmp_path, "pool.yml", "-l", "lab-a", inventory=inventory, calque_pool_runtime_wheelhouse=False)
    assert rc == 0
    rc, _ = play(tmp_path, "pool.yml", "-l", "lab-b", inventory=inventory, calque_pool_runtime_wheelhouse=False)
    assert rc == 0
    a, b = in_group("lab-a/embedder"), in_group("lab-b/embedder")
    assert len(a) == 2 and len(b) == 2

    # no -l: refused before anything is touched, saying how to choose
    rc, tasks = play(tmp_path, "teardown.yml", inventory=inventory)
    msg = tasks[TEARDOWN_GUARD]["msg"]
    assert rc != 0 and "2 pools (lab-a/embedder, lab-b/embedder)" in msg
    assert "-l" in msg and "calque_teardown_all_pools: true" in msg
    assert list(tasks) == [TEARDOWN_GUARD]  # the first task failed: nothing after it ran
    assert in_group("lab-a/embedder") == a and in_group("lab-b/embedder") == b

    # -l lab-a, with its queue and bucket: one pool, torn down with everything of its own; lab B's untouched
    everything = {"calque_teardown_queue": True, "calque_teardown_bucket": True}
    rc, _ = play(tmp_path, "teardown.yml", "-l", "lab-a", inventory=inventory, **everything)
    assert rc == 0 and in_group("lab-a/embedder") == [] and in_group("lab-b/embedder") == b
    left = pool_names("lab-b/embedder")
    queues = sorted(u.rsplit("/", 1)[-1] for u in client("sqs").list_queues().get("QueueUrls", []))
    assert queues == [left.queue, left.dlq]
    assert [x["Name"] for x in client("s3").list_buckets()["Buckets"]] == ["lab-b-calque-runs"]
    templates = client("ec2").describe_launch_templates()["LaunchTemplates"]
    assert [t["LaunchTemplateName"] for t in templates] == [left.template]
    roles = sorted(r["RoleName"] for r in client("iam").list_roles()["Roles"] if r["RoleName"].startswith("calque-"))
    assert roles == [left.role]

    # calque_teardown_all_pools: every pool the run names (here lab B's, the one left)
    play(tmp_path, "pool.yml", "-l", "lab-a", inventory=inventory, calque_pool_runtime_wheelhouse=False)
    assert len(in_group("lab-a/embedder")) == 2
    rc, _ = play(tmp_path, "teardown.yml", inventory=inventory, calque_teardown_all_pools=True)
    assert rc == 0 and in_group("lab-a/embedder") == [] and in_group("lab-b/embedder") == []
