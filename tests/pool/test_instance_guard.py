"""A worker on an Auto Scaling instance: scale-in protection while it holds a claim, a drain on termination.

IMDSv2 is a fake on 127.0.0.1 (``FakeImds``); Auto Scaling is moto, except CompleteLifecycleAction,
which moto 5.2 does not implement: the in-process tests check that one call against a strict fake
that accepts it only for a hook and an instance that moto says exist.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from acquire.scaling_fixtures import group_instances, make_group
from botocore.exceptions import ClientError
from calque.aws.acquire.scaling import TERMINATION_HOOK
from calque.aws.clients import client
from calque.aws.imds import Imds
from calque.pool.worker.instance import AsgInstance, NoInstance, discover

from pool.conftest import PROC_WAIT, FakeImds, Pool, wait_until

SLOW = {"STEADY_DELAY_SCALE": "60"}
POOL = "lab-a/steady"


class StrictLifecycleAutoscaling:
    """moto's Auto Scaling client, plus the CompleteLifecycleAction moto lacks, as strict as AWS's."""

    def __init__(self) -> None:
        self.real = client("autoscaling")
        self.completed: list[dict[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def complete_lifecycle_action(self, **kw: str) -> dict[str, Any]:
        hooks = self.real.describe_lifecycle_hooks(AutoScalingGroupName=kw["AutoScalingGroupName"])["LifecycleHooks"]
        found = self.real.describe_auto_scaling_instances(InstanceIds=[kw["InstanceId"]])["AutoScalingInstances"]
        if kw["LifecycleHookName"] not in [h["LifecycleHookName"] for h in hooks]:
            raise ClientError({"Error": {"Code": "ValidationError", "Message": "No such hook"}}, "Complete")
        if not found or found[0]["AutoScalingGroupName"] != kw["AutoScalingGroupName"]:
            raise ClientError({"Error": {"Code": "ValidationError", "Message": "No such instance"}}, "Complete")
        if kw["LifecycleActionResult"] not in ("CONTINUE", "ABANDON"):
            raise ClientError({"Error": {"Code": "ValidationError", "Message": "bad result"}}, "Complete")
        self.completed.append(kw)
        return {}


def _group_with_hook() -> tuple[str, str]:
    group = make_group(POOL)
    client("autoscaling").put_lifecycle_hook(
        AutoScalingGroupName=group,
        LifecycleHookName=TERMINATION_HOOK,
        LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
        HeartbeatTimeout=300,
        DefaultResult="CONTINUE",
    )
    return group, group_instances(group)[0]["InstanceId"]


def _protected(instance_id: str) -> bool:
    found = client("autoscaling").describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
    return bool(found[0]["ProtectedFromScaleIn"])


def test_protected_while_any_worker_holds_a_claim_and_the_last_one_out_completes_the_hook(
    moto: str, fake_imds: FakeImds, tmp_path: Path
) -> None:
    group, iid = _group_with_hook()
    asg = StrictLifecycleAutoscaling()
    guard = AsgInstance(asg, Imds(fake_imds.url), iid, group, tmp_path)
    guard.register("w1")
    guard.register("w2")
    guard.holding("w1", lambda: True)
    assert _protected(iid)
    guard.holding("w2", lambda: True)
    guard.holding("w1", lambda: False)
    assert _protected(iid)  # w2 still holds one
    guard.holding("w2", lambda: False)
    assert not _protected(iid)
    guard.leave("w1", drained=True)
    assert asg.completed == []  # w2 is still draining
    guard.leave("w2", drained=True)
    assert asg.completed == [
        {
            "LifecycleHookName": TERMINATION_HOOK,
            "AutoScalingGroupName": group,
            "InstanceId": iid,
            "LifecycleActionResult": "CONTINUE",
        }
    ]


def test_a_crashed_workers_marker_neither_keeps_protection_nor_blocks_the_drain(
    moto: str, fake_imds: FakeImds, tmp_path: Path
) -> None:
    group, iid = _group_with_hook()
    asg = StrictLifecycleAutoscaling()
    guard = AsgInstance(asg, Imds(fake_imds.url), iid, group, tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for kind in ("alive", "held"):
        (tmp_path / kind / "crashed").write_text(dead.stdout.strip())  # a worker killed with -9
    guard.register("w1")
    guard.holding("w1", lambda: True)
    assert _protected(iid)
    guard.leave("w1", drained=True)
    assert not _protected(iid) and len(asg.completed) == 1


def test_off_an_auto_scaling_instance_the_guard_does_nothing(moto: str, fake_imds: FakeImds) -> None:
    assert isinstance(discover(Imds(fake_imds.url), lambda: client("autoscaling")), NoInstance)  # no instance-id
    fake_imds.paths["instance-id"] = "i-0123456789abcdef0"  # an EC2 instance in no group
    assert isinstance(discover(Imds(fake_imds.url), lambda: client("autoscaling")), NoInstance)


@pytest.mark.slow
def test_a_worker_protects_its_instance_mid_claim_and_drains_when_the_group_terminates_it(
    make_pool: Any, fake_imds: FakeImds, tmp_path: Path
) -> None:
    pool: Pool = make_pool(vt=600)
    _group, iid = _group_with_hook()
    fake_imds.paths["instance-id"] = iid
    env = {**SLOW, "CALQUE_STATE_DIR": str(tmp_path / "state")}
    w = pool.start(env=env, imds_endpoint=fake_imds.url, spot_poll_s=0.3)
    w.wait_log("protecting it while claims are held")
    assert not _protected(iid)  # idle: free to be scaled in
    record = pool.submit([{"args": [i], "kwargs": {"delay": 0.5}} for i in range(3)], batch_size=3)
    w.wait_log("start 0", stream="stdout")
    wait_until(lambda: _protected(iid), PROC_WAIT, "scale-in protection while the claim is held")
    fake_imds.paths["autoscaling/target-lifecycle-state"] = "Terminated"
    assert w.proc.wait(timeout=PROC_WAIT) == 0, w.stderr()
    err = w.stderr()
    assert "Auto Scaling is terminating this instance" in err and "released message" in err
    assert "STEADY-EXIT" in w.stdout()  # @exit ran before the instance goes
    assert f"completing lifecycle action {TERMINATION_HOOK}" in err  # moto itself lacks the call
    assert not _protected(iid)
    wait_until(lambda: pool.queue.depth().visible == 1, PROC_WAIT, "the re-sent claim, visible at once")
    assert pool.store.summary_count(record.results_prefix) == 0
    w.proc.send_signal(signal.SIGTERM)  # already gone; the fixture's stop is a no-op
