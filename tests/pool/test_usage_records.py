"""A pool's usage outlives its instances: the records its own components write (the warm-up at boot, a
worker's guard from its start to the drain on the termination hook) are what the ledger and the lab's
gate count, so an instance EC2 no longer lists (AWS drops a terminated one within about an hour; moto
never does, so the test removes it from moto's EC2 backend itself) costs what it cost.

On the moto server with a stand-in IMDS and a stand-in ``/proc/stat`` (the kernel's boot time: the
warm-up counts from the boot, as EC2 bills).
"""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest
from acquire.scaling_fixtures import group_instances, make_group
from calque.aws.acquire.group import tag_group
from calque.aws.acquire.scaling import TERMINATION_HOOK
from calque.aws.clients import client
from calque.aws.imds import Imds
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.cli.main import cli
from calque.ledger.budget_gate import lab_pools_spend
from calque.ledger.events import Window
from calque.ledger.instance_records import read_records
from calque.ledger.pool_usage import spec_usage
from calque.models import PoolSpec
from calque.models.instance_usage import UsagePlace, usage_prefix
from calque.models.pool_names import USAGE_TAG
from calque.models.warmth import ReadyMark
from calque.pool.worker.instance import AsgInstance
from calque.pool.worker.instance_ready import source_key, warm_up
from calque.pool.worker.usage import PROC_ENV, InstanceUsage, RecordedInstance, boot_time
from click.testing import CliRunner
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2.models import ec2_backends
from support import fake_lifecycle_action, fake_scaling_activities

from pool.conftest import STEADY, FakeImds

POOL = "lab-a/embedder"
RATE = 0.8048  # g6.xlarge on demand (data/ec2-rates.yaml): make_group's type
H = 3600.0


def _pool(tmp_path: Path, fake_imds: FakeImds, booted_ago: float) -> tuple[PoolSpec, RunStore, str, str]:
    """The pool's group with one instance (tagged with where its usage goes), its bucket, the stand-ins."""
    group = make_group(POOL)
    iid = group_instances(group)[0]["InstanceId"]
    client("s3").create_bucket(Bucket="lab-a-pool")
    spec = PoolSpec(
        model="embedder", pool=POOL, workload="embedder.py", bucket="lab-a-pool", imds_endpoint=fake_imds.url
    )
    store = RunStore(client("s3"), "lab-a-pool", "calque", PoolQueue(None, spec.model, spec.queue_name).name)
    tag_group(client("autoscaling"), group, {USAGE_TAG: usage_prefix(UsagePlace(store.bucket, store.base))})
    fake_imds.paths.update({"instance-id": iid, "instance-type": "g6.xlarge"})
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text(f"cpu  1 2 3\nbtime {int(time.time() - booted_ago)}\nprocesses 9\n")
    return spec, store, group, iid


def _forget_terminated() -> None:
    """What AWS does about an hour after an instance ends: it is no longer listed."""
    backend = ec2_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
    for rid, res in list(backend.reservations.items()):
        if all(i.state == "terminated" for i in res.instances):
            del backend.reservations[rid]


def _listed(iid: str) -> bool:
    pages = client("ec2").get_paginator("describe_instances").paginate()
    return any(i["InstanceId"] == iid for p in pages for r in p["Reservations"] for i in r["Instances"])


def test_an_ended_pools_usage_and_gate_are_unchanged_once_ec2_forgets_its_instances(
    moto: str, fake_imds: FakeImds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mp = monkeypatch
    spec, store, group, iid = _pool(tmp_path, fake_imds, booted_ago=2 * H)
    mp.setenv(PROC_ENV, str(tmp_path / "proc"))
    fake_imds.paths["autoscaling/target-lifecycle-state"] = "InService"
    assert warm_up(spec).lifecycle == "none waiting"  # the boot's record, from the kernel's boot time

    # the worker's guard, as worker_process.py builds it on an Auto Scaling instance: busy, then drained
    asg = client("autoscaling")
    asg.put_lifecycle_hook(
        AutoScalingGroupName=group, LifecycleHookName=TERMINATION_HOOK, DefaultResult="CONTINUE",
        LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING", HeartbeatTimeout=300,
    )  # fmt: skip
    guard = AsgInstance(asg, Imds(fake_imds.url), iid, group, tmp_path / "state")
    usage = InstanceUsage(store, POOL, iid, "g6.xlarge", "worker-0", boot_time())  # as worker_process.py makes it
    worker = RecordedInstance(guard, usage.start())
    worker.register("w0")
    worker.holding("w0", lambda: True)
    worker.holding("w0", lambda: False)
    fake_lifecycle_action.open_action(group, TERMINATION_HOOK, iid)  # the group terminates it: calque-drain
    worker.leave("w0", drained=True)
    assert [c.result for c in fake_lifecycle_action.COMPLETED] == ["CONTINUE"]
    asg.update_auto_scaling_group(AutoScalingGroupName=group, MinSize=0, DesiredCapacity=0)

    records = read_records(store)
    assert sorted(r.writer for r in records) == ["warm-up", "worker-0"]
    (boot,) = [r for r in records if r.writer == "warm-up"]
    (drained,) = [r for r in records if r.writer == "worker-0"]
    assert drained.end == "terminated" and drained.busy and drained.ended_at is not None
    up_s = drained.ended_at.timestamp() - boot.started_at.timestamp()
    assert 2 * H - 5 <= up_s <= 2 * H + 60  # from the boot, not from the worker's start

    until = drained.ended_at.timestamp() + H  # a window after the end: nothing more accrues
    window = Window(until - 24 * H, until)
    before = spec_usage(spec, window, cross_check=False).events
    gate_before = lab_pools_spend(asg, client("s3"), "lab-a")
    assert _listed(iid)
    _forget_terminated()
    assert not _listed(iid)  # EC2 has forgotten it, as AWS does
    after = spec_usage(spec, window, cross_check=False).events
    assert after == before
    assert lab_pools_spend(asg, client("s3"), "lab-a") == gate_before
    assert sum(e.seconds for e in after) == up_s  # idle: no Summaries, so all of it warm-idle
    assert gate_before == (pytest.approx(RATE * up_s / H), pytest.approx(up_s / H))


def test_a_warmed_instance_records_its_stop_and_the_groups_history_flags_what_records_miss(
    moto: str, fake_imds: FakeImds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, store, group, iid = _pool(tmp_path, fake_imds, booted_ago=600)
    spec = spec.model_copy(update={"workload": str(STEADY)})
    monkeypatch.setenv(PROC_ENV, str(tmp_path / "proc"))
    mark = tmp_path / "ready.json"
    monkeypatch.setenv("CALQUE_READY_MARK", str(mark))
    ready = ReadyMark(
        source=source_key(spec), workload_digest="-", steps=[], seconds=0.0, at=datetime.now(timezone.utc)
    )
    mark.write_text(ready.model_dump_json())  # bootstrapped already: this boot only completes the hook
    fake_imds.paths["autoscaling/target-lifecycle-state"] = "Warmed:Stopped"
    warm_up(spec)
    (record,) = read_records(store)
    assert record.end == "stopped" and record.lifecycle_state == "Warmed:Stopped"
    assert record.ended_at is not None and abs(record.ended_at.timestamp() - record.started_at.timestamp() - 600) < 60

    asg = client("autoscaling")
    asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=2)  # a launch that writes nothing
    fresh = next(i["InstanceId"] for i in group_instances(group) if i["InstanceId"] != iid)
    asg.update_auto_scaling_group(AutoScalingGroupName=group, MinSize=0, DesiredCapacity=0)
    now = time.time()
    window = Window(now - H, now + 60)
    flagged = spec_usage(spec, window).disagreements
    assert [f for f in flagged if fresh in f] == [
        f"pool {POOL}: the group launched or ended {fresh} in the window but it wrote no usage record"
    ]
    assert not [f for f in flagged if iid in f]  # stopped just now, terminated just now: they agree
    fake_scaling_activities.shift(iid, 2 * H - 120)  # ended two hours after its records stop: a restart unrecorded
    flagged = spec_usage(spec, Window(now - H, now + 3 * H)).disagreements
    assert any(f.startswith(f"pool {POOL}: {iid}'s records end -7") for f in flagged), flagged


def test_report_reconcile_prints_the_ledger_beside_cost_explorers_bill(
    moto: str, fake_imds: FakeImds, tmp_path: Path
) -> None:
    spec, store, _group, iid = _pool(tmp_path, fake_imds, booted_ago=0)
    start = time.time() - 3 * H
    usage = InstanceUsage(store, POOL, iid, "g6.xlarge", "worker-0", started_at=start)
    usage.start(every_s=3600)
    usage.finish("terminated")
    day = time.strftime("%Y-%m-%d", time.gmtime())
    result = {
        "results": [
            {
                "ResultsByTime": [
                    {
                        "TimePeriod": {"Start": day, "End": day},
                        "Total": {"UnblendedCost": {"Amount": "2.6100", "Unit": "USD"}},
                        "Groups": [],
                        "Estimated": True,
                    }
                ]
            }
        ]
    }
    req = urllib.request.Request(
        f"{moto}/moto-api/static/ce/cost-and-usage-results", data=json.dumps(result).encode(), method="POST"
    )
    urllib.request.urlopen(req, timeout=30).read()
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json())
    out = CliRunner().invoke(cli, ["report", "--pool-spec", str(path), "--no-sessions", "--reconcile", "--json"])
    assert out.exit_code == 0, out.output
    (rec,) = json.loads(out.output)["reconciled"]
    assert rec["pool"] == POOL and rec["billed_usd"] == 2.61 and rec["estimated"] is True
    assert abs(rec["ledger_usd"] - RATE * 3) < 0.01  # three hours up today at g6.xlarge's rate
    text = CliRunner().invoke(cli, ["report", "--pool-spec", str(path), "--no-sessions", "--reconcile"])
    assert "Cost Explorer $2.61 (estimated)" in text.output and "ledger $2.4" in text.output
