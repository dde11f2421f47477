"""Receiving ahead and deleting in batches: fast claims amortise their SQS calls, slow ones hold one ahead.

A real worker (in a thread) on the session moto server, its SQS client wrapped only to record the
requests it makes; the deletes in batch against moto itself.
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any

import pytest
from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.errors import CalqueError
from calque.models import ClaimRef, Item, PoolSpec, QueueSettings
from calque.pool.submitter.stage import stage_run
from calque.pool.worker.intake import MAX_AHEAD, Ahead
from calque.pool.worker.lease import Lease, Role, State, delete_together
from calque.pool.worker.loop import Worker
from calque.warm import WarmSupervisor

from pool.conftest import RUN_WAIT, STEADY, wait_until

MODEL = "org/intake"
BUCKET = "intake-bucket"


class RecordingSqs:
    """The worker's boto3 SQS client, recording how many messages each receive asked for and each batch."""

    def __init__(self, sqs: Any) -> None:
        self._sqs = sqs
        self.receives: list[int] = []
        self.batch_deletes: list[int] = []
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sqs, name)

    def receive_message(self, **kw: Any) -> Any:
        resp = self._sqs.receive_message(**kw)
        if resp.get("Messages"):
            with self.lock:
                self.receives.append(kw["MaxNumberOfMessages"])
        return resp

    def delete_message_batch(self, **kw: Any) -> Any:
        with self.lock:
            self.batch_deletes.append(len(kw["Entries"]))
        return self._sqs.delete_message_batch(**kw)


def test_the_depth_is_one_until_claims_are_seen_to_drain_faster_than_the_round_trip() -> None:
    ahead = Ahead()
    assert ahead.depth() == 1  # nothing known: one ahead, as before
    ahead.fetched(0.05)
    assert ahead.depth() == 1  # no claim drained yet
    ahead.drained(2.0)
    assert ahead.depth() == 1  # slow claims: one ahead
    for _ in range(20):
        ahead.drained(0.01)
    assert ahead.depth() == 5  # 50 ms round trip / 10 ms per claim
    ahead.fetched(3.0)  # a receive that long-polled an empty queue says nothing about the round trip
    assert ahead.depth() == 5
    for _ in range(20):
        ahead.drained(0.0001)
    assert ahead.depth() == MAX_AHEAD  # never more than one receive can bring


def _worker(sqs: Any, delay: float, claims: int) -> tuple[Worker, RunStore, Any]:
    spec = PoolSpec(model=MODEL, workload=str(STEADY), bucket=BUCKET, queue=QueueSettings(receive_wait=1),
                    spot_watch=False)  # fmt: skip
    pq = PoolQueue(sqs, MODEL)
    pq.ensure(QueueSettings(receive_wait=1, encryption=False))
    store = RunStore(client("s3"), BUCKET, "calque", pq.name)
    items = [Item(index=i, args=[i], kwargs={"delay": delay}) for i in range(claims)]
    record = stage_run(pq, store, items, run_id="run-intake", model=MODEL, method="work", batch_size=1)
    return Worker(spec, WarmSupervisor.load(spec), pq, store, worker_id="w"), store, record


@pytest.mark.parametrize(("delay", "claims"), [(0.0, 60), (0.4, 4)])
def test_fast_claims_come_in_batches_slow_ones_one_ahead_and_every_result_arrives_once(
    moto: str, delay: float, claims: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEADY_ENTER_S", "0")
    client("s3").create_bucket(Bucket=BUCKET)
    sqs = RecordingSqs(client("sqs"))
    worker, store, record = _worker(sqs, delay, claims)
    thread = threading.Thread(target=worker.serve, name="worker", daemon=True)
    thread.start()
    try:
        wait_until(lambda: store.summary_count(record.results_prefix) == claims, RUN_WAIT, "every Summary")
        wait_until(lambda: worker.queue.depth().in_flight == 0, RUN_WAIT, "every message deleted")
    finally:
        worker.request_stop("test")
        thread.join(timeout=RUN_WAIT)
    assert not thread.is_alive()
    results = store.results(record)
    assert [(r.index, r.ok, r.value["x"]) for r in results] == [(i, True, i) for i in range(claims)]
    depth = worker.queue.depth()
    assert depth.visible == depth.in_flight == depth.dlq_visible == 0
    if delay:
        assert set(sqs.receives) == {1}  # a claim of 0.4 s: never more than one received ahead
        assert sqs.batch_deletes == []
    else:
        assert max(sqs.receives) > 1 and len(sqs.receives) < claims
        assert sqs.batch_deletes and max(sqs.batch_deletes) > 1


def _held(pq: PoolQueue, n: int) -> list[Lease]:
    now = datetime.now(timezone.utc)
    for i in range(n):
        pq.send(ClaimRef(run_id="run-d", claim_id=f"c{i}", model=MODEL, method="work", manifest_uri="s3://b/r/m.json",
                         results_prefix="s3://b/r/", item_count=1, submitted_at=now))  # fmt: skip
    msgs: list[dict[str, Any]] = []
    while len(msgs) < n:
        msgs += pq.receive(1, n - len(msgs))
    leases = [
        Lease(message_id=m["MessageId"], receipt=m["ReceiptHandle"], body=m["Body"], receive_count=1) for m in msgs
    ]
    for lease in leases:
        lease._state = State.SUMMARISED
    return leases


def test_a_batch_delete_answers_each_lease_alone(moto: str) -> None:
    pq = PoolQueue(client("sqs"), MODEL)
    pq.ensure(QueueSettings(receive_wait=1, encryption=False))
    ok, taken, refused = _held(pq, 3)
    taken.advance(State.LOST, Role.KEEPER)  # another worker owns it now: its receipt is never sent
    refused.receipt = "not-a-receipt-handle"
    sent: list[list[str]] = []

    def call(receipts: list[str]) -> dict[str, CalqueError | None]:
        sent.append(receipts)
        return pq.ack_many(receipts)

    out = delete_together([ok, taken, refused], call)
    assert sent == [[ok.receipt, refused.receipt]]
    assert out[0] is True and out[1] is False
    assert isinstance(out[2], CalqueError) and "no longer held by this worker" in str(out[2])
    assert (ok.state, taken.state, refused.state) == (State.DELETED, State.LOST, State.ABANDONED)
    assert pq.depth().in_flight == 2  # the taken one and the refused one stay; only ours went
