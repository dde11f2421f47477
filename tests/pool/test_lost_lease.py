"""Stale receipt handles, with a strict in-process SQS (moto would delete with a stale handle)."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest
from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.models import ClaimRef, Item, ItemResult, Manifest, PoolSpec, QueueSettings, Summary
from calque.pool.worker import Worker
from calque.warm import WarmSupervisor

from pool.conftest import STEADY, wait_until
from pool.strict_sqs import StrictFakeSqs


@pytest.mark.parametrize("heartbeat_s", [0.2, 60.0], ids=["heartbeat-notices", "writer-notices"])
def test_lost_lease_writes_no_second_summary_and_does_not_ack(moto: str, tmp_path: Path, heartbeat_s: float) -> None:
    s3 = client("s3")
    s3.create_bucket(Bucket="strict-bucket")
    fake = StrictFakeSqs(visibility_timeout=30)
    pq = PoolQueue(fake, "org/strict")
    store = RunStore(s3, "strict-bucket", "calque", pq.name)
    now = datetime.now(timezone.utc)
    prefix = store.run_prefix("run-1")
    manifest = Manifest(run_id="run-1", claim_id="c0", model="org/strict", method="work",
                        items=[Item(index=0, args=[7], kwargs={"delay": 1.5})])  # fmt: skip
    uri = store.put_manifest(prefix, manifest)
    ref = ClaimRef(run_id="run-1", claim_id="c0", model="org/strict", method="work", manifest_uri=uri,
                   results_prefix=prefix, item_count=1, submitted_at=now)  # fmt: skip
    mid = pq.send(ref)
    spec = PoolSpec(
        model="org/strict", workload=str(STEADY), bucket="strict-bucket", queue=QueueSettings(receive_wait=1),
        heartbeat_s=heartbeat_s, prefetch=False, spot_watch=False,
    )  # fmt: skip
    worker = Worker(spec, WarmSupervisor.load(spec), pq, store, worker_id="A")
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    try:
        wait_until(lambda: fake.in_flight(), 10, "worker A to take the claim")
        a_handle = fake.messages[mid].handle
        # A misses its heartbeats (say, a network partition); SQS hands the claim to B, who finishes it.
        fake.expire(mid)
        (b_msg,) = pq.receive(0)
        assert b_msg["ReceiptHandle"] != a_handle
        b_summary = Summary(
            run_id="run-1", claim_id="c0", model="org/strict", method="work", ok=True, items=1, failed=0,
            warm_hit=True, enter_seconds_paid=0.0, enter_count=1, attempt=2, worker_id="B", started_at=now,
            finished_at=now, claim_seconds=0.1, method_seconds=0.1,
        )  # fmt: skip
        store.put_results(prefix, "c0", [ItemResult(index=0, ok=True, value={"x": 7, "pid": 0}, seconds=0.1)])
        store.put_summary(prefix, b_summary)
        pq.ack(b_msg["ReceiptHandle"])
        wait_until(lambda: worker.metrics.get("calque_pool_claims_total", outcome="lost") == 1, 20, "A to give up")
    finally:
        worker.request_stop("test")
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert store.summaries(prefix)["c0"].worker_id == "B"
    assert [h for h, _ in fake.delete_calls] == [b_msg["ReceiptHandle"]]
    assert worker.metrics.get("calque_pool_leases_lost_total") == 1
    assert not fake.messages  # B's delete really deleted it
