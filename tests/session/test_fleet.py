"""An elastic class's two sides against moto, with a real session daemon and a stand-in IMDS on 127.0.0.1.

- The broker's demand (``calque.session.broker.demand``): requests waiting longer than ``wait_s`` that
  no running host of the class can serve land in CloudWatch as ``UnservedRequests`` (GetMetricData
  reads them back), and nothing lands while the class's host has a free slice for them or while they
  are younger than ``wait_s``. The host is found through its registration, written by the real
  ``calque session fleet register`` into moto's SSM.
  A drained host's (or GPU's) free slices are no supply: requests wait unserved beside them, and the
  host, with no live session, still counts idle.
- The host's fleet helper (``calque session fleet protect --once``): the instance is protected from
  scale-in while a user holds a live session on the daemon, and not before or after. On its way out
  of the group it drains the host with ``--by`` inside the hook's hold: checkouts are refused naming
  the drain, the live session gets its notice and ends at the drain's deadline, the hook completes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from calque.aws.clients import client
from calque.models.fleet import DemandClass, DemandSettings, HostRegistration, registration_path
from calque.models.pool_names import pool_names
from calque.session.broker.demand import FleetDemand
from calque.session.broker.hosts import HostCache
from calque.session.broker.local import LocalHost
from calque.session.broker.store import NewRequest, Store
from pool.conftest import FakeImds
from support.waits import HANG_S

from .conftest import CLI, VENV_PY, Host, User, wait_for

CLASS = "teaching"
GROUP = pool_names(f"fleet/{CLASS}").group


@pytest.fixture
def instance(moto: str) -> Iterator[tuple[str, FakeImds]]:
    """A real instance of the class's group in moto, and the IMDS that says it is this machine."""
    ec2, asg = client("ec2"), client("autoscaling")
    ami = client("ssm").get_parameter(Name="/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64")
    tid = ec2.create_launch_template(
        LaunchTemplateName="fleet-test", LaunchTemplateData={"ImageId": ami["Parameter"]["Value"]}
    )["LaunchTemplate"]["LaunchTemplateId"]
    asg.create_auto_scaling_group(
        AutoScalingGroupName=GROUP, MinSize=1, MaxSize=2, DesiredCapacity=1, AvailabilityZones=["us-east-1a"],
        LaunchTemplate={"LaunchTemplateId": tid, "Version": "1"},
    )  # fmt: skip
    iid = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]["Instances"][0]
    imds = FakeImds()
    imds.paths.update({"instance-id": iid["InstanceId"], "local-ipv4": "127.0.0.1"})
    try:
        yield iid["InstanceId"], imds
    finally:
        imds.close()


def fleet_cli(imds: FakeImds, moto: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``calque session fleet ARGS`` as root, as the host's user-data and helper unit run it."""
    env = {**os.environ, "CALQUE_IMDS": imds.url}
    cmd = [str(VENV_PY), "-c", CLI, "session", "fleet", *args, "--region", "us-east-1", "--endpoint-url", moto]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_S)


def protected(iid: str) -> bool:
    found = client("autoscaling").describe_auto_scaling_instances(InstanceIds=[iid])["AutoScalingInstances"]
    return bool(found[0]["ProtectedFromScaleIn"])


def read_back(metric: str, since: datetime) -> list[float]:
    """The metric's values for the class, as CloudWatch's GetMetricData returns them."""
    out = client("cloudwatch").get_metric_data(
        MetricDataQueries=[
            {
                "Id": "m",
                "MetricStat": {
                    "Metric": {
                        "Namespace": "calque/session",
                        "MetricName": metric,
                        "Dimensions": [{"Name": "Class", "Value": CLASS}],
                    },
                    "Period": 60,
                    "Stat": "Maximum",
                },
            }
        ],
        StartTime=since - timedelta(minutes=5),
        EndTime=datetime.now(timezone.utc) + timedelta(minutes=5),
    )
    return [float(v) for r in out["MetricDataResults"] for v in r["Values"]]


def test_a_host_with_a_live_session_is_protected_and_one_without_is_not(
    host: Host, make_user: Callable[..., User], instance: tuple[str, FakeImds], moto: str
) -> None:
    iid, imds = instance
    host.start(mps=False)
    alice = make_user()
    sock = ("--socket", str(host.socket))
    done = fleet_cli(imds, moto, "protect", "--class", CLASS, "--once", *sock)
    assert done.returncode == 0, done.stderr
    assert "not protected" in done.stdout and not protected(iid)

    host.cli(alice, "session", "checkout", "--profile", "1g.5gb", "--ttl", "10m", check=True)
    done = fleet_cli(imds, moto, "protect", "--class", CLASS, "--once", *sock)
    assert done.returncode == 0, done.stderr
    assert protected(iid), done.stdout + done.stderr

    host.cli(alice, "session", "checkin", check=True)
    done = fleet_cli(imds, moto, "protect", "--class", CLASS, "--once", *sock)
    assert done.returncode == 0, done.stderr
    assert not protected(iid)


def test_unserved_demand_lands_in_cloudwatch_only_when_no_host_of_the_class_can_serve(
    host: Host, make_user: Callable[..., User], instance: tuple[str, FakeImds], moto: str, tmp_path: Path
) -> None:
    iid, imds = instance
    host.start(mps=False)
    done = fleet_cli(imds, moto, "register", "--class", CLASS, "--offers", "1g.5gb")
    assert done.returncode == 0, done.stderr
    param = client("ssm").get_parameter(Name=f"{registration_path(CLASS)}/{iid}")["Parameter"]
    reg = HostRegistration.model_validate(json.loads(param["Value"]))
    assert (reg.name, reg.address, reg.offers) == (iid, "127.0.0.1", ["1g.5gb"])

    store, cache = Store(tmp_path / "broker/broker.db"), HostCache({})
    settings = DemandSettings(
        classes={CLASS: DemandClass(offers=["1g.5gb"]), "other": DemandClass(offers=["mps"])},
        wait_s=30, region="us-east-1", endpoint_url=moto,
    )  # fmt: skip
    fleet = FleetDemand(settings, store, cache, lambda r: LocalHost(r.name, host.socket))
    now = time.time()
    old = NewRequest("req-old-0001", 1001, "u1001", "a", "mig", "1g.5gb", 3600.0, False, True, now - 120, None)
    young = NewRequest("req-new-0001", 1002, "u1002", "a", "mig", "1g.5gb", 3600.0, False, True, now, None)
    store.submit(old, max_queued=4)
    store.submit(young, max_queued=4)
    since = datetime.now(timezone.utc)

    # the class's host has free slices: waiting requests it can serve are no demand for more hosts
    fleet.discover()
    assert cache.names == [iid]
    cache.refresh(iid)
    first = {d.fleet_class: d for d in fleet.once()}
    assert (first[CLASS].unserved, first[CLASS].idle_hosts, first[CLASS].hosts) == (0, 1, 1)
    assert first["other"].unserved == 0  # an MPS class could never serve a MIG request
    assert read_back("UnservedRequests", since) == []
    assert read_back("IdleHosts", since) == [1.0]

    # every slice of the host taken: the request that waited past wait_s is unserved, the young one not yet
    bob = make_user()
    for _ in host.migs:
        host.cli(bob, "session", "checkout", "--profile", "1g.5gb", "--ttl", "10m", check=True)
    cache.refresh(iid)
    second = {d.fleet_class: d for d in fleet.once()}
    assert (second[CLASS].unserved, second[CLASS].idle_hosts) == (1, 0)
    assert read_back("UnservedRequests", since) == [1.0]

    # the host leaves the class (its registration deleted): out of the cache
    assert fleet_cli(imds, moto, "deregister", "--class", CLASS).returncode == 0
    fleet.discover()
    assert cache.names == []
    store.close()


def test_the_broker_and_the_scaling_name_the_same_metrics() -> None:
    from calque.aws.acquire import fleet_scaling
    from calque.session.broker import demand

    assert demand.IDLE_METRIC == fleet_scaling.IDLE_METRIC
    doc: dict[str, Any] = fleet_scaling.desired_fleet_scaling(
        pool_names("fleet/x"), "x", fleet_scaling.FleetScalingSettings(slices_per_host=4)
    ).alarms
    assert {a["MetricName"] for a in doc.values()} == {"UnservedRequests", demand.IDLE_METRIC}


def test_a_drained_hosts_free_slices_are_no_supply_and_it_still_counts_idle(
    host: Host, make_user: Callable[..., User], instance: tuple[str, FakeImds], moto: str, tmp_path: Path
) -> None:
    """Every slice of the host free but drained (its GPU, then the whole host): the waiting request
    is unserved, so the class grows; the host, with no live session, is idle, so scale-in may take it."""
    iid, imds = instance
    host.start(mps=False)
    assert fleet_cli(imds, moto, "register", "--class", CLASS, "--offers", "1g.5gb").returncode == 0
    store, cache = Store(tmp_path / "broker/broker.db"), HostCache({})
    settings = DemandSettings(classes={CLASS: DemandClass(offers=["1g.5gb"])}, wait_s=30, region="us-east-1",
                              endpoint_url=moto)  # fmt: skip
    fleet = FleetDemand(settings, store, cache, lambda r: LocalHost(r.name, host.socket))
    old = NewRequest("req-old-0002", 1001, "u1001", "a", "mig", "1g.5gb", 3600.0, False, True, time.time() - 120, None)
    store.submit(old, max_queued=4)
    since = datetime.now(timezone.utc)
    fleet.discover()

    def counted() -> tuple[int, int, int]:
        cache.refresh(iid)
        d = {c.fleet_class: c for c in fleet.once()}[CLASS]
        return d.unserved, d.idle_hosts, d.hosts

    assert counted() == (0, 1, 1)  # free and not drained: the host can serve it
    gpu = str(host.migs[0].gpu_index)
    host.cli(None, "session", "drain", "--gpu", gpu, "--reason", "firmware", check=True)
    assert counted() == (1, 1, 1)
    assert read_back("UnservedRequests", since) == [1.0]
    host.cli(None, "session", "undrain", check=True)
    assert counted() == (0, 1, 1)  # served again once undrained
    host.cli(None, "session", "drain", "--reason", "rack move", check=True)
    assert counted() == (1, 1, 1)
    assert read_back("IdleHosts", since) == [1.0]
    store.close()


def test_a_host_leaving_its_group_drains_with_by_refuses_checkouts_and_completes_the_hook_in_its_hold(
    host: Host, make_user: Callable[..., User], instance: tuple[str, FakeImds], moto: str
) -> None:
    """The drain hook (``calque-drain``) holds the instance; IMDS says Terminated. The helper drains the
    whole host with ``--by`` inside the hold (``drain_window``), deletes its registration, waits while a
    session is live, then completes the action with CONTINUE. Meanwhile a new checkout there is refused
    naming the drain, and the live session gets its notice and runs until the drain's deadline, where
    it ends (reason ``drained``). moto has no lifecycle actions: tests/support/fake_lifecycle_action.py
    stands for the one AWS opens."""
    from calque.session.fleet.protect import DRAIN_REASON, drain_window
    from support import fake_lifecycle_action as fla

    from .conftest import wait_for

    iid, imds = instance
    hold, every = 20.0, 1.0
    by_s, wait_s = drain_window(hold, every)
    assert 1 <= by_s < wait_s <= hold - every
    client("autoscaling").put_lifecycle_hook(
        AutoScalingGroupName=GROUP, LifecycleHookName="calque-drain", HeartbeatTimeout=int(hold),
        DefaultResult="CONTINUE", LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
    )  # fmt: skip
    host.start(mps=False)
    assert fleet_cli(imds, moto, "register", "--class", CLASS, "--offers", "1g.5gb").returncode == 0
    alice, bob = make_user(), make_user()
    s = json.loads(host.cli(alice, "session", "checkout", "--profile", "1g.5gb", "--ttl", "10m", "--json").stdout)
    imds.paths["autoscaling/target-lifecycle-state"] = "Terminated"
    fla.open_action(GROUP, "calque-drain", iid)
    began = time.time()
    env = {**os.environ, "CALQUE_IMDS": imds.url}
    args = ["--class", CLASS, "--every", f"{every:g}", "--hold", f"{hold:g}", "--socket", str(host.socket)]
    cmd = [
        str(VENV_PY),
        "-c",
        CLI,
        "session",
        "fleet",
        "protect",
        *args,
        "--region",
        "us-east-1",
        "--endpoint-url",
        moto,
    ]
    helper = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: bool(host.client().drains())), "the helper never drained the host"
        (d,) = host.client().drains()
        assert d.gpu is None and d.reason == DRAIN_REASON and d.deadline is not None  # the whole host, --by
        assert began + by_s - 2 <= d.deadline.timestamp() <= time.time() + by_s + 1

        # A new checkout there is refused naming the drain; Alice's session runs on meanwhile.
        res = host.cli(bob, "session", "checkout", "--profile", "1g.5gb", "--ttl", "10m")
        assert res.returncode == 4 and "this host is drained" in res.stderr and DRAIN_REASON in res.stderr, res.stderr
        assert [x.session_id for x in host.client().list_slices() if x.session_id] == [s["id"]]

        _, err = helper.communicate(timeout=hold + HANG_S)
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()
    assert helper.returncode == 0, err
    took = time.time() - began
    # It waited for the session's end (at the drain's deadline) before completing. Within the hold by its
    # own bound (drain_window, asserted above); how long that takes on a loaded machine is for bench/.
    assert took >= by_s - 1, (took, err)
    assert [(c.instance_id, c.hook, c.result) for c in fla.COMPLETED] == [(iid, "calque-drain", "CONTINUE")]
    found = client("ssm").get_parameters_by_path(Path=registration_path(CLASS), Recursive=True)["Parameters"]
    assert found == []  # the broker stops routing to it
    assert not any(x.session_id for x in host.client().list_slices())
    ended = [e for e in host.audit_events() if e.get("session") == s["id"]]
    kinds = [e["event"] for e in ended]
    assert "notice" in kinds and "drained" in kinds and kinds.index("notice") < kinds.index("drained"), kinds
    with sqlite3.connect(host.dir / "state/sessions.db") as db:
        assert db.execute("SELECT end_reason FROM sessions WHERE id=?", (s["id"],)).fetchone() == ("drained",)


def test_a_failed_drain_step_is_logged_and_the_hook_still_completes_within_its_hold(
    instance: tuple[str, FakeImds], moto: str, tmp_path: Path
) -> None:
    """No daemon answers (its socket is not there): the drain step fails and says so, the helper
    cannot count sessions so it waits out its bound, then completes the action before the hold ends."""
    from support import fake_lifecycle_action as fla

    iid, imds = instance
    client("autoscaling").put_lifecycle_hook(
        AutoScalingGroupName=GROUP, LifecycleHookName="calque-drain", HeartbeatTimeout=30, DefaultResult="CONTINUE",
        LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
    )  # fmt: skip
    imds.paths["autoscaling/target-lifecycle-state"] = "Terminated"
    fla.open_action(GROUP, "calque-drain", iid)
    began = time.monotonic()
    done = fleet_cli(
        imds, moto, "protect", "--class", CLASS, "--every", "1", "--hold", "5", "--socket", str(tmp_path / "none.sock")
    )
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    assert "drain step" in done.stderr and "exited" in done.stderr, done.stderr
    # It waited out its bound, hold - every (4 s), then completed; the command returned at all (a hang
    # aside) only because that bound ended its wait.
    assert took >= 3.5, took
    assert [(c.instance_id, c.hook, c.result) for c in fla.COMPLETED] == [(iid, "calque-drain", "CONTINUE")]


def test_a_fleet_host_is_protected_before_its_first_session_is_granted(
    host: Host, make_user: Callable[..., User], instance: tuple[str, FakeImds], moto: str
) -> None:
    """The daemon grants only while the helper says the instance is protected (``session/scalein.py``):
    a first checkout asks, the helper (whose own period is an hour here) protects at once, and only
    then is the checkout answered. With no helper the checkout is refused after ``scale_in_wait``."""
    iid, imds = instance
    guard = host.dir / "fleet-guard"
    host.start(mps=False, scale_in_guard=str(guard), scale_in_wait=HANG_S)
    alice = make_user()
    sock = ("--socket", str(host.socket))
    env = {**os.environ, "CALQUE_IMDS": imds.url}
    helper = subprocess.Popen(
        [str(VENV_PY), "-c", CLI, "session", "fleet", "protect", "--class", CLASS, "--every", "3600",
         "--guard", str(guard), *sock, "--region", "us-east-1", "--endpoint-url", moto],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # The helper's start: not protected (and it says so to the daemon).
        if not wait_for(lambda: (guard / "protected").exists()):
            helper.terminate()
            raise AssertionError(f"the helper never wrote its guard: {helper.communicate(timeout=HANG_S)[0]}")
        assert not protected(iid)
        res = host.cli(alice, "session", "checkout", "--profile", "1g.5gb", "--ttl", "10m", "--json")
        assert res.returncode == 0, res.stderr
        assert protected(iid)  # already, when the grant came back: not at the helper's next period
    finally:
        helper.terminate()
        helper.communicate(timeout=HANG_S)
    assert host.cli(alice, "session", "checkin").returncode == 0
    done = fleet_cli(imds, moto, "protect", "--class", CLASS, "--once", "--guard", str(guard), *sock)
    assert done.returncode == 0, done.stderr
    assert not protected(iid) and (guard / "protected").read_text().strip() == "0"

    # No helper: the first checkout waits for protection, then is refused naming the helper.
    host.stop()
    host.start(mps=False, scale_in_guard=str(guard), scale_in_wait=1.0)
    res = host.cli(alice, "session", "checkout", "--profile", "1g.5gb", "--ttl", "10m")
    assert res.returncode == 4 and "calque-session-fleet.service" in res.stderr, res.stderr
    assert json.loads(host.cli(None, "session", "list", "--json").stdout)[0]["busy"] is False
