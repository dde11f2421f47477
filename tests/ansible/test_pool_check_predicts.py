"""``pool.yml --check --diff`` predicts the real run that follows it, on the default runtime path.

The sandbox inventory stages the wheel and its wheelhouse (the default): check mode builds the wheel
locally and signs the URLs locally, so its user-data, and the config digest the group computes from
it, are the real run's. Each case runs check mode, then the real run, and compares what a person
reads: which tasks change, the config digest, what rolls, the desired count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from calque.aws.acquire.scaling import backlog_target
from calque.aws.clients import client
from calque.models.pool_names import pool_names
from test_pool_group_playbook import GROUP_TASK, SANDBOX_GROUP, in_group, play

SPEC_TASK = "Staged calque runtime and worker user-data"
SPEC_FILE_TASK = "Pool spec file (once the group took the spec)"
CHECK_ONLY = {"Does the pool bucket exist yet (check mode only)"}


def changed(tasks: dict[str, dict[str, Any]]) -> list[str]:
    return sorted(name for name, res in tasks.items() if res.get("changed") and name not in CHECK_ONLY)


def failures(tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The failed tasks' messages (what an assertion on a run's rc shows), not the whole run."""
    return {name: res.get("msg") or res.get("stderr") or res for name, res in tasks.items() if res.get("failed")}


def predicted_then_real(tmp_path: Path, **extra: Any) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    before = in_group()
    rc, check = play(tmp_path, "pool.yml", "--check", "--diff", **extra)
    assert rc == 0, failures(check)
    assert in_group() == before  # check mode launched and ended nothing
    rc, real = play(tmp_path, "pool.yml", **extra)
    assert rc == 0, failures(real)
    assert changed(check) == changed(real)
    predicted, done = check[GROUP_TASK], real[GROUP_TASK]
    assert predicted["config"] == done["config"]  # the digest the real run launched with
    assert predicted["desired"] == done["desired"]
    assert sorted(predicted["rolling"]) == sorted(done["rolling"])
    return check, real


def made_from_nothing(tmp_path: Path, first: dict[str, dict[str, Any]]) -> None:
    """What pool.yml's first run made: template, group, queue, the workers' IAM, scaling, spec and runtime."""
    group = first[GROUP_TASK]
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
    info = first[SPEC_TASK]["runtime"]
    assert info["uploaded"] is True and info["key"] == "calque/runtime/calque-0.1.0-py3-none-any.whl"
    head = client("s3").head_object(Bucket="calque-sandbox-runs", Key=info["key"])
    assert head["Metadata"]["calque-sha256"] == info["sha256"]
    user_data = first[SPEC_TASK]["user_data"]
    assert f"RUNTIME_SHA256={info['sha256']}\n" in user_data and "RUNTIME_URL='http://127.0.0.1:" in user_data


@pytest.mark.slow
def test_check_diff_agrees_with_the_real_run_unchanged_new_spec_and_new_count(moto: str, tmp_path: Path) -> None:
    """One pool through its life, each change checked before it is made: made from nothing (everything
    test_pool_playbook.py's from-nothing test asserted, whose three runs were these first three), unchanged,
    a refused and then a consented roll to a new spec that also replaces an instance EC2 marked unhealthy (one
    run for both: each is predicted by its check), a scale-out that needs no terminate consent, a scale-in that
    does. (This test took over test_pool_group_playbook.py's spec-change and
    count tests, whose steps it repeated with a pool.yml run of its own each: every assertion of both
    is here, in this order of runs.)"""
    no_terminate = {"calque_i_understand_this_terminates_instances": False}
    rc, first = play(tmp_path, "pool.yml", **no_terminate)  # making a pool needs no terminate consent
    assert rc == 0, failures(first)
    made_from_nothing(tmp_path, first)
    staged = first[SPEC_TASK]["runtime"]
    assert staged["wheelhouse_key"] and staged["wheelhouse_sha256"]  # the default path: a wheelhouse is staged
    instances = in_group()
    assert len(instances) == 2
    # the workers export the scaling policy's target beside the backlog (docs/monitoring.md)
    written_spec = yaml.safe_load((tmp_path / "spec" / "pool.yml").read_text())
    assert written_spec["backlog_target"] == backlog_target(latency_s=60, seconds_per_claim=2)  # the sandbox's scaling

    # unchanged: check mode says nothing changes, no new digest, nothing rolls; and the real run agrees
    check, real = predicted_then_real(tmp_path)
    assert changed(check) == [] and check[GROUP_TASK]["rolling"] == []
    assert check[GROUP_TASK]["config"] == first[GROUP_TASK]["config"]
    assert check[SPEC_TASK]["runtime"]["wheelhouse_sha256"] == staged["wheelhouse_sha256"]
    assert in_group() == instances

    # a changed spec without the terminate consent: the roll is refused, naming the inventory variable,
    # and the spec file and the instances stay as they were
    spec = {"method": "embed", "parameters": {"dim": 16}, "workers": 1, "spot_watch": False, "shutdown_grace_s": 5}
    spec_file = tmp_path / "spec" / "pool.yml"
    written = spec_file.read_text()
    rc, tasks = play(tmp_path, "pool.yml", calque_pool_spec=spec, **no_terminate)
    assert rc != 0 and "calque_i_understand_this_terminates_instances: true" in tasks[GROUP_TASK]["msg"]
    assert spec_file.read_text() == written and in_group() == instances

    # with it, and with an instance EC2 marks unhealthy: one run replaces that instance and rolls the
    # other to the new digest (the spec file and the template change); check mode predicted both
    client("autoscaling").set_instance_health(InstanceId=instances[0], HealthStatus="Unhealthy")
    check, real = predicted_then_real(tmp_path, calque_pool_spec=spec)
    planned = check[GROUP_TASK]
    assert changed(check) == sorted([SPEC_FILE_TASK, GROUP_TASK])
    assert planned["config"] != first[GROUP_TASK]["config"]
    assert planned["rolling"] == [instances[1]] and planned["diff"]["after"]["replaces"] == [instances[0]]
    assert planned["diff"]["before"]["config"] != planned["diff"]["after"]["config"]
    assert planned["diff"]["after"]["config"] == real[GROUP_TASK]["config"]
    assert real[GROUP_TASK]["replaced"] == [instances[0]]  # the unhealthy one, replaced by this run
    assert real[GROUP_TASK]["template_version"] == 2 and real[GROUP_TASK]["refresh_id"]
    now = in_group()
    assert len(now) == 2 and not set(now) & set(instances)  # every instance replaced or rolled

    # a changed count: only the group changes, to 3, with no roll; scaling out needs no terminate consent
    three = {**SANDBOX_GROUP, "count": 3}
    check, real = predicted_then_real(tmp_path, calque_pool_spec=spec, calque_pool_group=three, **no_terminate)
    assert changed(check) == [GROUP_TASK] and check[GROUP_TASK]["desired"] == 3 and check[GROUP_TASK]["rolling"] == []
    assert real[GROUP_TASK]["desired"] == 3 and len(in_group()) == 3

    # lowering it does: refused without the consent (naming the inventory variable), made with it
    one = {**SANDBOX_GROUP, "count": 1}
    rc, tasks = play(tmp_path, "pool.yml", calque_pool_spec=spec, calque_pool_group=one, **no_terminate)
    assert (
        rc != 0
        and "calque_i_understand_this_terminates_instances: true (inventory"
        in tasks["Spend gate (worst case, consents) before anything is made"]["msg"]
    )
    assert len(in_group()) == 3
    rc, tasks = play(tmp_path, "pool.yml", calque_pool_spec=spec, calque_pool_group=one)
    assert rc == 0 and tasks[GROUP_TASK]["changed"] and len(in_group()) == 1
