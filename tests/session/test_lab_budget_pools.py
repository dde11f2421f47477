"""One budget per lab across sessions and pools, held by the runtime between playbook runs.

A real host daemon (real Unix users in two labs' groups, a simulated A100), the broker's budget round
(``BrokerLedger.check_budgets``, its pools read through ``PoolBudgets``) reaching the daemon over its
socket, and the labs' pools on the moto server (their groups, and their instances' usage records as
the instances' own writer puts them in the bucket):

- a lab over its budget through its pool alone has its next checkout and its ``extend`` refused on
  the daemon, with one sentence;
- a lab over its budget through its sessions alone has its pool held at its running claims (the
  instances a busy worker protects), then at zero, by the broker's round, not by ``pool.yml``; its
  workers take no new claim meanwhile; an admin's override (audited on the host) releases it.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from acquire.scaling_fixtures import group_instances, make_group
from calque.aws.acquire.group import tag_group, usage_tag
from calque.aws.clients import client
from calque.aws.imds import Imds
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.models import QueueSettings
from calque.models.institution import Institution
from calque.models.pool_names import pool_names
from calque.pool.worker.instance import AsgInstance
from calque.pool.worker.intake import Receiver
from calque.pool.worker.usage import InstanceUsage
from calque.session.broker.broker_config import PoolLedgerSettings
from calque.session.broker.broker_ledger import BrokerLedger
from calque.session.broker.local import LocalHost
from calque.session.broker.pool_budgets import PoolBudgets
from calque.session.broker.store import Store

from .conftest import LAB_A, LAB_B, Host, User
from .institution import free_port, make_host

H = 3600.0


@dataclass
class Lab:
    host: Host
    ledger: BrokerLedger
    users: tuple[User, User]


@pytest.fixture
def lab_host(make_user: Callable[..., User], moto: str) -> Iterator[Callable[[list[dict[str, Any]]], Lab]]:
    root = Path(tempfile.mkdtemp(prefix="calque-budget-", dir="/tmp"))
    root.chmod(0o755)
    made: list[tuple[Host, Store]] = []

    def make(labs: list[dict[str, Any]]) -> Lab:
        alice, bob = make_user([LAB_A]), make_user([LAB_B])
        host = make_host(root, "hostA", 2, alice, free_port())
        inst = root / "institution.yaml"
        inst.write_text(yaml.safe_dump({"version": 1, "labs": labs}))
        inst.chmod(0o644)
        host.start(institution=str(inst))
        store = Store(root / "broker.db")
        made.append((host, store))
        budgeted = [lab for lab in Institution.model_validate(yaml.safe_load(inst.read_text())).labs if lab.budget]
        pools = PoolBudgets(PoolLedgerSettings(region="us-east-1", endpoint_url=moto))
        ledger = BrokerLedger(store, {"hostA": LocalHost("hostA", host.socket)}, budgeted, None, pools)
        return Lab(host, ledger, (alice, bob))

    yield make
    for host, store in made:
        host.stop()
        store.close()
    shutil.rmtree(root, ignore_errors=True)


def _pool(pool: str, desired: int) -> tuple[str, RunStore]:
    """``pool``'s group on moto with ``desired`` instances, tagged with where their usage records go."""
    group = make_group(pool, desired=desired)
    bucket = pool.replace("/", "-")
    client("s3").create_bucket(Bucket=bucket)
    store = RunStore(client("s3"), bucket, "calque", PoolQueue(None, "m", pool_names(pool).queue).name)
    tag_group(client("autoscaling"), group, usage_tag(pool, bucket, "calque"))
    return group, store


def _sentence(stderr: str) -> str:
    """The refusal without its figures (a live session adds to them between two calls)."""
    return re.sub(r"\d+\.\d+", "N", " ".join(stderr.split()))


def test_a_lab_over_budget_through_its_pool_alone_is_refused_checkout_and_extend(
    lab_host: Callable[[list[dict[str, Any]]], Lab],
) -> None:
    lab = lab_host([{"name": "lab-a", "groups": [LAB_A], "budget": {"usd": 1.0, "raised_by": "rc@example.edu"}}])
    alice = lab.users[0]
    assert lab.host.cli(alice, "session", "checkout", "--json").returncode == 0  # under: a 1/7 slice, seconds
    group, store = _pool("lab-a/embedder", 1)
    iid = group_instances(group)[0]["InstanceId"]
    usage = InstanceUsage(store, "lab-a/embedder", iid, "g6.xlarge", "worker-0", started_at=time.time() - 2 * H)
    usage.start(every_s=H)
    usage.finish("terminated")  # two hours of a g6.xlarge: $1.61, more than the lab's $1 on its own

    (spend,) = lab.ledger.check_budgets()
    assert spend.state == "over" and 1.6 < spend.ec2_usd < 1.7  # the pool's $1.61 and a few seconds of slice
    checkout = lab.host.cli(alice, "session", "checkout")
    extend = lab.host.cli(alice, "session", "extend", "--by", "10m")
    assert checkout.returncode == 4 and extend.returncode == 4, (checkout.stderr, extend.stderr)
    assert "lab lab-a has used 1.6" in checkout.stderr and "rc@example.edu" in checkout.stderr
    assert _sentence(extend.stderr) == _sentence(checkout.stderr)  # one sentence at both doors


def test_a_lab_over_budget_through_its_sessions_alone_has_its_pool_held_at_its_running_claims(
    lab_host: Callable[[list[dict[str, Any]]], Lab], tmp_path: Path
) -> None:
    lab = lab_host([{"name": "lab-b", "groups": [LAB_B], "budget": {"gpu_hours": 0.0001}}])
    bob = lab.users[1]
    group, _store = _pool("lab-b/trainer", 2)  # two instances, no usage yet: the pool spent nothing
    asg = client("autoscaling")
    busy = group_instances(group)[0]["InstanceId"]
    asg.set_instance_protection(InstanceIds=[busy], AutoScalingGroupName=group, ProtectedFromScaleIn=True)
    assert lab.host.cli(bob, "session", "checkout", "--json").returncode == 0
    # 0.0001 GPU-h (0.36 GPU-s) is spent in under 3 s on a 1/7 slice
    assert _wait_state(lab.ledger, "over")

    def shape() -> tuple[int, int, int]:
        g = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"][0]
        return g["MinSize"], g["MaxSize"], g["DesiredCapacity"]

    assert shape() == (0, 1, 1)  # held at its one running claim: nothing new starts, the busy one serves on
    assert busy in [i["InstanceId"] for i in group_instances(group)]
    queue = PoolQueue(client("sqs"), "lab-b-trainer")
    queue.ensure(QueueSettings(visibility_timeout=30, receive_wait=0, max_receive_count=5, encryption=False))
    client("sqs").send_message(QueueUrl=queue.url(), MessageBody="{}")  # the backlog's next claim
    assert _receiver(queue, AsgInstance(asg, Imds("http://127.0.0.1:9"), busy, group, tmp_path)).receive(0) == []
    assert queue.depth().visible == 1  # the busy worker takes no new claim while its pool is held
    asg.set_instance_protection(InstanceIds=[busy], AutoScalingGroupName=group, ProtectedFromScaleIn=False)
    lab.ledger.check_budgets()  # the claim finished: the next round lowers it to zero
    assert shape() == (0, 0, 0)

    grant = lab.host.cli(None, "budget", "override", "lab-b", "--extra", "10", "--reason", "deadline")
    assert grant.returncode == 0, grant.stderr
    (spend,) = lab.ledger.check_budgets()  # the broker counts the host's override: released as it was
    assert spend.state != "over" and shape()[:2] == (0, 4)
    fresh = AsgInstance(asg, Imds("http://127.0.0.1:9"), busy, group, tmp_path)  # a worker's next read
    assert len(_receiver(queue, fresh).receive(0)) == 1  # released: it serves the backlog again
    assert [e["lab"] for e in lab.host.audit_events() if e.get("event") == "budget_override"] == ["lab-b"]


def _receiver(queue: PoolQueue, guard: AsgInstance) -> Receiver:
    """The worker's receiver as its loop builds it on an Auto Scaling instance (paused by the guard's hold)."""
    stopped = threading.Event()
    stopped.set()  # a paused receive returns at once instead of waiting out its pause
    return Receiver(queue, hold=lambda _: None, prepare=lambda _: None, stop=stopped, wait_s=0, paused=guard.held)


def _wait_state(ledger: BrokerLedger, state: str) -> bool:
    from .conftest import wait_for

    return wait_for(lambda: ledger.check_budgets()[0].state == state, every=0.5)
