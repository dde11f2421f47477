"""The metrics added for the rules: the broker's queue (a real queue file) and a pool's backlog (a
real queue on the moto server), as a scrape renders them."""

from __future__ import annotations

import threading
from pathlib import Path

from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.models import QueueSettings
from calque.pool.worker.backlog import NAME, BacklogSampler
from calque.pool.worker.worker_metrics import Metrics, worker_labels
from calque.session.broker.broker_metrics import BrokerCollector, collector_registry
from calque.session.broker.store import NewRequest, Store
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.waits import HANG_S, until

HOUR = 3600.0


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _req(rid: str, uid: int, lab: str, at: float, profile: str | None = "1g.24gb", kind: str = "mig") -> NewRequest:
    return NewRequest(rid, uid, f"u{uid}", lab, kind, profile, HOUR, False, True, at, None)


def test_the_broker_exports_its_queue_by_lab_and_the_oldest_wait(tmp_path: Path) -> None:
    store = Store(tmp_path / "state/broker.db")
    try:
        store.submit(_req("req-a1", 1001, "lab-a", 100.0), max_queued=4)
        store.submit(_req("req-a2", 1002, "lab-a", 160.0), max_queued=4)
        store.submit(_req("req-b1", 1003, "lab-b", 130.0, profile=None, kind="mps"), max_queued=4)
        store.submit(_req("req-b2", 1004, "lab-b", 140.0, profile=None, kind="mps"), max_queued=4)
        store.begin_grant("req-b1", "gpu1")  # being granted: live, no longer waiting
        store.submit(_req("req-c1", 1005, "lab-c", 150.0), max_queued=4)
        store.cancel("req-c1", None)  # ended: not live, not exported
        reg = CollectorRegistry(auto_describe=False)
        reg.register(BrokerCollector(store.live, 1800.0, now=lambda: 400.0))  # a fixed clock
        got = _samples(generate_latest(reg).decode())
        live = _samples(generate_latest(collector_registry(store.live, aging=1800.0)).decode())  # the broker's own
    finally:
        store.close()

    def at(name: str, **labels: str) -> float | None:
        return got.get((name, frozenset(labels.items())))

    mig_a = {"lab": "lab-a", "kind": "mig", "profile": "1g.24gb"}
    mps_b = {"lab": "lab-b", "kind": "mps", "profile": "any"}
    assert at("calque_broker_requests", **mig_a, state="queued") == 2
    assert at("calque_broker_requests", **mig_a, state="granting") == 0
    assert at("calque_broker_requests", **mps_b, state="queued") == 1
    assert at("calque_broker_requests", **mps_b, state="granting") == 1
    assert at("calque_broker_queue_wait_seconds", **mig_a) == 300.0  # the oldest: enqueued at 100
    assert at("calque_broker_queue_wait_seconds", **mps_b) == 260.0  # b1 is being granted: b2's wait
    assert at("calque_broker_queue_aging_seconds") == 1800.0
    assert not any(dict(labels).get("lab") == "lab-c" for _, labels in got)
    assert not any("user" in dict(labels) for _, labels in got)  # who waits is not exported
    assert {k for k in live if k[0] != "calque_broker_queue_wait_seconds"} == {
        k for k in got if k[0] != "calque_broker_queue_wait_seconds"
    }
    assert live[("calque_broker_queue_wait_seconds", frozenset(mig_a.items()))] > 300.0  # now, not 400


def test_a_workers_backlog_is_the_queues_visible_and_in_flight_messages(moto: str) -> None:
    pq = PoolQueue(client("sqs"), "org/backlog")
    pq.ensure(QueueSettings(visibility_timeout=30, receive_wait=0, encryption=False))
    sqs = client("sqs")
    for i in range(5):
        sqs.send_message(QueueUrl=pq.url(), MessageBody=f"claim-{i}")
    sqs.receive_message(QueueUrl=pq.url(), MaxNumberOfMessages=2, VisibilityTimeout=30)  # two in flight
    metrics = Metrics({"model": "org/backlog", "worker": "w"})
    stop = threading.Event()
    sampler = BacklogSampler(pq, metrics, every_s=0.1, stop=stop)
    assert sampler.sample()
    assert metrics.get(NAME, state="visible") == 3 and metrics.get(NAME, state="in_flight") == 2
    # the loop reads again until stopped, and stops within one period
    written: list[float] = []
    t = threading.Thread(target=BacklogSampler(pq, metrics, 0.1, stop, lambda: written.append(1.0)).loop)
    t.start()
    until(lambda: len(written) >= 2, "the sampler reads again")
    stop.set()
    t.join(HANG_S)
    assert not t.is_alive() and len(written) >= 2


def test_a_failed_backlog_reading_leaves_a_gap_not_a_stale_figure(moto: str) -> None:
    pq = PoolQueue(client("sqs"), "org/gone")
    pq.ensure(QueueSettings(visibility_timeout=30, receive_wait=0, encryption=False))
    metrics = Metrics({"model": "org/gone", "worker": "w"})
    sampler = BacklogSampler(pq, metrics, every_s=1, stop=threading.Event())
    assert sampler.sample() and metrics.get(NAME, state="visible") == 0
    client("sqs").delete_queue(QueueUrl=pq.url())
    assert not sampler.sample()
    text = generate_latest(metrics.registry).decode()
    assert "calque_pool_queue_messages{" not in text  # the family stays, its samples are gone


def test_a_named_pools_workers_carry_its_name_and_an_unnamed_ones_do_not() -> None:
    assert worker_labels("org/m", "h:1/0", "lab-a/embedder") == {
        "model": "org/m",
        "worker": "h:1/0",
        "pool": "lab-a/embedder",
    }
    assert worker_labels("org/m", "h:1", None) == {"model": "org/m", "worker": "h:1"}
