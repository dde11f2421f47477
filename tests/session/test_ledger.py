"""The ledger of a scripted day equals the hand-computed one: sessions on two hosts (real registries,
real simulated GPUs, real Unix users in two labs' groups) and a pool's claims on moto (Summaries in
S3, its instance's usage record beside them, written by the worker's own writer), through the code
``calque report`` runs.

Hand computation (rates: data/ec2-rates.yaml, data/modal-gpu-prices.yaml):
  teach (RTX PRO 6000, 1g.24gb = 1/4 GPU; EC2 g7e.2xlarge $3.36/GPU-h; Modal RTX-PRO-6000 $0.000842/s)
    alice 4 h -> 1 GPU-h, $3.36, Modal $3.0312;  bob 1.5 h -> 0.375 GPU-h, $1.26, Modal $1.13670
  research (A100-40GB, 1g.5gb = 1/7 GPU; EC2 p4d.24xlarge $21.96/8 = $2.745/GPU-h; Modal A100-40GB $0.000583/s)
    alice 7 h -> 1 GPU-h, $2.745, Modal $2.0988;  bob live 2 h -> 2/7 GPU-h, $0.784286, Modal $0.599657
  pool lab-a/embedder (one g6e.xlarge, L40S, $1.861/h; Modal L40S $0.000542/s), up 8 h in the window:
    3 claims of 1200 s -> busy 1 h: $1.861, Modal $1.9512;  warm-idle 7 h: $13.027, Modal $0
  lab-a: 10 GPU-h, $20.993, Modal $7.0812;  lab-b: 0.375 + 2/7 GPU-h, $2.044286, Modal $1.736357
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from calque.aws.clients import client
from calque.aws.store import RunStore
from calque.gpu.sim import SimGpu
from calque.ledger.events import Window
from calque.ledger.instance_records import instance_spans, read_records
from calque.ledger.pool_usage import pool_summaries, pool_usage, spec_usage
from calque.ledger.report import build_report, render_csv
from calque.models import PoolSpec, Summary
from calque.models.pool_names import pool_names
from calque.pool.worker.usage import InstanceUsage
from calque.session.daemon import daemon_ledger
from calque.session.daemon.host import Host
from calque.session.session_config import load_config

from .conftest import LAB_A, LAB_B, User

H = 3600.0
POOL = "lab-a/embedder"


def _host(d: Path, name: str, card: str, profiles: list[str], institution: Path) -> Host:
    d.mkdir(mode=0o755)
    sim = SimGpu.create(d / "gpus.json", [card], mig=True, root=d / "root", seed=name)
    sim.create_instances(0, profiles)
    cfg = {
        "version": 1,
        "socket": str(d / "session.sock"),
        "db": str(d / "state/sessions.db"),
        "audit_log": str(d / "audit.jsonl"),
        "gpu_backend": "sim",
        "sim_state": str(sim.state_path),
        "host_name": name,
        "institution": str(institution),
    }
    (d / "session.yaml").write_text(yaml.safe_dump(cfg))
    return Host.build(load_config(d / "session.yaml"))


def _hold(h: Host, sid: str, user: User, start: float, end: float | None) -> None:
    free = [s for s in h.inventory.slices() if s.id not in {x.session.slice_id for x in h.registry.live()}]
    h.registry.checkout(
        free[:1], session_id=sid, uid=user.uid, gid=user.gid, user=user.name, now=start, ttl=24 * H,
        max_sessions=None, request_id=None, env_for=lambda s: {},
    )  # fmt: skip
    if end is not None:
        assert h.registry.end(sid, "checkin", end) is not None


@pytest.fixture
def labs(make_user: Callable[..., User], tmp_path: Path) -> Iterator[tuple[User, User, Path]]:
    alice, bob = make_user([LAB_A]), make_user([LAB_B])
    inst = tmp_path / "institution.yaml"
    inst.write_text(
        yaml.safe_dump(
            {"version": 1, "labs": [{"name": "lab-a", "groups": [LAB_A]}, {"name": "lab-b", "groups": [LAB_B]}]}
        )
    )
    yield alice, bob, inst


def _pool_on_moto(moto: str) -> tuple[RunStore, Any, float]:
    """The pool's group with one g6e.xlarge (moto launches it now), its bucket and the usage record its
    worker writes from its start (now, live); the start."""
    names = pool_names(POOL)
    ec2, asg, s3 = client("ec2"), client("autoscaling"), client("s3")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.create_launch_template(
        LaunchTemplateName=names.template, LaunchTemplateData={"ImageId": ami, "InstanceType": "g6e.xlarge"}
    )
    asg.create_auto_scaling_group(
        AutoScalingGroupName=names.group, MinSize=1, MaxSize=1, DesiredCapacity=1,
        LaunchTemplate={"LaunchTemplateName": names.template}, AvailabilityZones=["us-east-1a"],
    )  # fmt: skip
    s3.create_bucket(Bucket="lab-a-pool")
    store = RunStore(s3, "lab-a-pool", "calque", names.queue)
    (inst,) = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[names.group])["AutoScalingGroups"][0]["Instances"]
    usage = InstanceUsage(store, POOL, inst["InstanceId"], "g6e.xlarge", "worker-0")
    usage.beat()
    return store, ec2, usage.record.started_at.timestamp()


def _summary(run: str, claim: str, start: float, seconds: float) -> Summary:
    t = datetime.fromtimestamp(start, timezone.utc)
    return Summary(
        run_id=run, claim_id=claim, model="embedder", method="embed", ok=True, items=10, failed=0,
        warm_hit=True, enter_seconds_paid=0.0, enter_count=1, attempt=1, worker_id="w:1",
        instance_type="g6e.xlarge", started_at=t, finished_at=datetime.fromtimestamp(start + seconds, timezone.utc),
        claim_seconds=seconds, method_seconds=seconds,
    )  # fmt: skip


def test_the_ledger_of_a_scripted_day_equals_the_hand_computed_one(
    labs: tuple[User, User, Path], moto: str, tmp_path: Path
) -> None:
    alice, bob, inst = labs
    store, _ec2, launched = _pool_on_moto(moto)
    since, until = launched - 10 * H, launched + 8 * H  # the pool's instance is up for the last 8 h
    t0 = since + H
    summaries = [_summary("r1", f"c{i}", t, 1200) for i, t in enumerate((t0 + 9.5 * H, t0 + 11 * H, t0 + 14 * H))]
    summaries.append(_summary("r0", "old", since - 5 * H, 600))  # before the window: not counted
    for s in summaries:
        assert store.put_if_absent(
            store.summary_uri(store.run_prefix(s.run_id), s.claim_id), s.model_dump_json().encode()
        )

    teach = _host(tmp_path / "teach", "teach", "RTX-PRO-6000-Blackwell-Server-Edition", ["1g.24gb"] * 4, inst)
    research = _host(tmp_path / "research", "research", "A100-40GB", ["1g.5gb"] * 7, inst)
    try:
        _hold(teach, "s-a1", alice, t0, t0 + 4 * H)
        _hold(teach, "s-b1", bob, t0 + H, t0 + 2.5 * H)
        _hold(teach, "s-old", bob, since - 3 * H, since - H)  # ended before the window: not counted
        _hold(research, "s-a2", alice, since - H, since + 7 * H)  # began before it: 7 h inside
        _hold(research, "s-b2", bob, until - 2 * H, None)  # live: counted to the window's end
        hosts = [daemon_ledger.host_ledger(h, since, until) for h in (teach, research)]
    finally:
        teach.close()
        research.close()
    window = Window(since, until)
    spec = PoolSpec(model="embedder", pool=POOL, workload="embedder.py", bucket="lab-a-pool", prefix="calque")
    pool_events = spec_usage(spec, window).events  # what `calque report --pool-spec` reads: S3 on moto
    spans = instance_spans(read_records(store), time.time())  # its record is live now: to the window's end
    assert pool_events == pool_usage(POOL, pool_summaries(store), spans, window)
    pools = [(POOL, datetime.fromtimestamp(until, timezone.utc), pool_events)]

    def rows(by: str) -> dict[str, tuple[float, float, float]]:
        r = build_report(by, window_dt(since), window_dt(until), hosts, pools)  # type: ignore[arg-type]
        return {x.key: (round(x.gpu_hours, 4), round(x.ec2_usd, 4), round(x.modal_usd, 4)) for x in [*r.rows, r.total]}

    by_lab = rows("lab")
    assert by_lab["lab-a"] == (10.0, 20.993, 7.0812)
    assert by_lab["lab-b"] == (
        round(0.375 + 2 / 7, 4),
        round(1.26 + 2 / 7 * 2.745, 4),
        round(1.1367 + 7200 / 7 * 0.000583, 4),
    )
    by_user = rows("user")
    assert by_user[alice.name] == (2.0, 6.105, 5.13)
    assert by_user["-"] == (8.0, 14.888, 1.9512)  # the pool's instance-hours belong to no user
    by_source = rows("source")
    assert by_source["pool-busy"] == (1.0, 1.861, 1.9512)
    assert by_source["pool-idle"] == (7.0, 13.027, 0.0)  # warm and idle: paid on EC2, nothing on Modal
    by_profile = rows("profile")
    assert by_profile["1g.24gb"] == (1.375, 4.62, round(1.375 * 3600 * 0.000842, 4))
    assert by_profile["1g.5gb"][0] == round(1 + 2 / 7, 4)
    total = build_report("lab", window_dt(since), window_dt(until), hosts, pools).total  # type: ignore[arg-type]
    assert total.ratio == round(total.modal_usd / total.ec2_usd, 4)
    csv = render_csv(build_report("lab", window_dt(since), window_dt(until), hosts, pools))
    assert csv.splitlines()[0] == "lab,events,gpu_hours,ec2_usd,modal_usd,ratio,unpriced_events,stale"
    assert json.loads(hosts[1].model_dump_json())["events"][0]["gpu_fraction"] == pytest.approx(1 / 7)


def window_dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, timezone.utc)
