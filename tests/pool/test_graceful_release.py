"""A graceful release is not a delivery attempt; a real failure still is (issue 10, section 4).

Stopping workers re-send the claim (attempts carried in the ClaimRef) and delete the old message,
so restarts never walk a healthy claim towards the DLQ; crashes and lost leases still count, on
SQS's redrive and, across re-sends, on the worker's check of the queue's maxReceiveCount.
"""

from __future__ import annotations

import json
import signal
from datetime import datetime, timezone

import pytest
from calque.aws.clients import client
from calque.models import ClaimRef, QueueSettings
from calque.pool.worker.lease import Lease
from calque.pool.worker.release import carried_ref, release_uncounted

from pool.conftest import PROC_WAIT, Pool, wait_until

SLOW = {"STEADY_DELAY_SCALE": "60"}  # 30 s per item: a worker is always mid-claim when stopped
FAST = {"STEADY_DELAY_SCALE": "0.1"}


def _ref(**changes: object) -> ClaimRef:
    doc = {
        "run_id": "run-1",
        "claim_id": "c00000",
        "model": "org/steady",
        "method": "work",
        "manifest_uri": "s3://b/calque/runs/run-1/manifests/c00000.json",
        "results_prefix": "s3://b/calque/runs/run-1/",
        "item_count": 1,
        "submitted_at": datetime(2026, 12, 1, tzinfo=timezone.utc),
        **changes,
    }
    return ClaimRef.model_validate(doc)


def test_a_first_send_omits_attempts_so_older_workers_still_read_it() -> None:
    assert "attempts" not in json.loads(_ref().body())
    assert json.loads(_ref(attempts=2).body())["attempts"] == 2


def test_the_carried_count_adds_the_counted_receives_but_not_the_graceful_one() -> None:
    lease = Lease(message_id="m", receipt="r", body=_ref(attempts=1).body(), receive_count=3)
    ref = carried_ref(lease)
    assert ref is not None and ref.attempts == 3  # 1 carried + 2 earlier receives that crashed or lapsed
    assert Lease(message_id="m", receipt="r", body="not json", receive_count=1).ref is None
    assert carried_ref(Lease(message_id="m", receipt="r", body="not json", receive_count=1)) is None


def _dlq_depth(pool: Pool) -> int:
    return pool.queue.depth().dlq_visible


@pytest.mark.slow
def test_a_claim_released_by_three_graceful_restarts_is_served_and_never_dead_lettered(make_pool) -> None:
    pool: Pool = make_pool(vt=600, max_receive_count=2)
    # SQS's redrive at 2 receives: with visibility-0 releases the third restart dead-lettered the claim
    pool.queue.ensure(QueueSettings(visibility_timeout=600, receive_wait=1, max_receive_count=2, encryption=False))
    record = pool.submit([{"args": [i], "kwargs": {"delay": 0.5}} for i in range(3)], batch_size=3)
    for _ in range(3):
        w = pool.start(env=SLOW)
        w.wait_log("start 0", stream="stdout")
        w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(timeout=PROC_WAIT) == 0, w.stderr()
        assert "released message" in w.stderr()
        assert _dlq_depth(pool) == 0
    final = pool.start(env=FAST)
    (summary,) = pool.wait_run(record).values()
    assert summary.ok and summary.worker_id.endswith(str(final.proc.pid))
    assert summary.attempt == 1  # three graceful releases, none of them counted
    assert [r.index for r in pool.store.results(record)] == [0, 1, 2]
    assert _dlq_depth(pool) == 0


def _receive_and_drop(pool: Pool) -> dict:
    """What a worker that crashes does to a message: receive it and never delete it (visibility 0 here
    only to skip the wait for its VT; SQS counts the receive either way)."""
    sqs, url = client("sqs"), pool.queue.url()
    msg = wait_until(
        lambda: sqs.receive_message(
            QueueUrl=url, WaitTimeSeconds=1, MessageSystemAttributeNames=["ApproximateReceiveCount"]
        ).get("Messages"),
        PROC_WAIT,
        "a message",
    )[0]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"], VisibilityTimeout=0)
    return msg


@pytest.mark.slow
def test_a_claim_that_really_fails_max_receive_count_times_is_dead_lettered(make_pool) -> None:
    pool: Pool = make_pool(max_receive_count=3)
    pool.queue.ensure(QueueSettings(visibility_timeout=30, receive_wait=1, max_receive_count=3, encryption=False))
    record = pool.submit([1], batch_size=1)
    for _ in range(3):
        _receive_and_drop(pool)
    sqs, url = client("sqs"), pool.queue.url()
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages") is None  # redriven on receive 4
    wait_until(lambda: _dlq_depth(pool) == 1, PROC_WAIT, "the claim in the DLQ")
    assert pool.store.summary_count(record.results_prefix) == 0


@pytest.mark.slow
def test_real_failures_still_count_across_a_graceful_resend(make_pool) -> None:
    pool: Pool = make_pool()
    # SQS's redrive at 3 receives: each message stays under it, the claim's attempts do not
    pool.queue.ensure(QueueSettings(visibility_timeout=30, receive_wait=1, max_receive_count=3, encryption=False))
    record = pool.submit([1], batch_size=1)
    _receive_and_drop(pool)
    _receive_and_drop(pool)  # two crashes: counted
    sqs, url = client("sqs"), pool.queue.url()
    held = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1, MessageSystemAttributeNames=["All"])["Messages"][0]
    lease = Lease(
        message_id=held["MessageId"],
        receipt=held["ReceiptHandle"],
        body=held["Body"],
        receive_count=int(held["Attributes"]["ApproximateReceiveCount"]),
    )
    release_uncounted(pool.queue, lease, lease.receipt)  # the third receive ends gracefully: not counted
    resent = _receive_and_drop(pool)  # a crash on the re-sent message: counted again
    assert resent["MessageId"] != held["MessageId"] and json.loads(resent["Body"])["attempts"] == 2
    pool.start()  # 2 carried + this message's 2nd receive = attempt 4, over the queue's limit of 3
    (s,) = pool.wait_run(record).values()
    assert not s.ok and s.error, s
    assert "received 4 times (across graceful re-sends), over the queue's maxReceiveCount 3" in s.error
