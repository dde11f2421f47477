"""Stale leases, with a strict in-process SQS (moto would delete with a stale handle).

Worker A takes a claim; its lease runs out unnoticed (a partition, a pause) and SQS hands the claim
to worker B, who completes it. Whatever A does afterwards, the claim's Summary is B's, and the
results every reader gets (``RunStore.results``, ``calque pool results``) are B's, item by item.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.cli.main import run
from calque.models import ClaimRef, Item, Manifest, PoolSpec, QueueSettings, RunRecord
from calque.pool.worker.loop import Worker
from calque.warm import WarmSupervisor
from support.waits import HANG_S

from pool.conftest import HERE, wait_until
from pool.strict_sqs import StrictFakeSqs

GATED = HERE / "workloads" / "gated.py"
MODEL = "org/strict"
BUCKET = "strict-bucket"
ITEMS = 3
WAIT = HANG_S  # a loaded 2-core CI box: every wait ends as soon as its condition holds; only a hang reaches it


class PausableS3:
    """Worker A's S3 client (boto3, the session moto server) with two test controls.

    ``pause_summary``: A's Summary PUT waits for ``release`` (A passed its lease check, then
    stalled). ``refuse_delete``: A cannot delete objects (A died before cleaning up after itself).
    """

    def __init__(self, s3: Any, *, pause_summary: bool, refuse_delete: bool) -> None:
        self._s3 = s3
        self.pause_summary = pause_summary
        self.refuse_delete = refuse_delete
        self.at_summary = threading.Event()
        self.release = threading.Event()
        self.results_puts: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s3, name)

    def put_object(self, **kw: Any) -> Any:
        if "/results/" in kw["Key"]:
            self.results_puts.append(kw["Key"])
        if self.pause_summary and "/summaries/" in kw["Key"]:
            self.at_summary.set()
            assert self.release.wait(WAIT), "the test never released A's Summary PUT"
        return self._s3.put_object(**kw)

    def delete_object(self, **kw: Any) -> Any:
        if self.refuse_delete:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "test: A cannot delete"}}, "DeleteObject")
        return self._s3.delete_object(**kw)


@dataclass
class Claim:
    fake: StrictFakeSqs
    pq: PoolQueue
    store: RunStore
    record: RunRecord
    message_id: str
    tmp: Path

    def worker(self, worker_id: str, s3: Any, heartbeat_s: float, gate: str = "") -> tuple[Worker, threading.Thread]:
        spec = PoolSpec(
            model=MODEL, workload=str(GATED), bucket=BUCKET, queue=QueueSettings(receive_wait=1),
            parameters={"gate": gate, "tag": worker_id}, heartbeat_s=heartbeat_s, prefetch=False, spot_watch=False,
        )  # fmt: skip
        store = RunStore(s3, BUCKET, "calque", self.pq.name)
        w = Worker(spec, WarmSupervisor.load(spec), self.pq, store, worker_id=worker_id)
        t = threading.Thread(target=w.serve, name=f"worker-{worker_id}", daemon=True)
        t.start()
        return w, t


@pytest.fixture
def claim(moto: str, tmp_path: Path) -> Iterator[Claim]:
    s3 = client("s3")
    s3.create_bucket(Bucket=BUCKET)
    fake = StrictFakeSqs(visibility_timeout=600)  # leases run out only when the test says so
    pq = PoolQueue(fake, MODEL)
    store = RunStore(s3, BUCKET, "calque", pq.name)
    now = datetime.now(timezone.utc)
    prefix = store.run_prefix("run-1")
    manifest = Manifest(run_id="run-1", claim_id="c0", model=MODEL, method="work",
                        items=[Item(index=i, args=[i]) for i in range(ITEMS)])  # fmt: skip
    uri = store.put_manifest(prefix, manifest)
    record = RunRecord(run_id="run-1", model=MODEL, method="work", queue_name=pq.name, results_prefix=prefix,
                       item_count=ITEMS, claims=["c0"], submitted_at=now)  # fmt: skip
    store.put_run(record)
    ref = ClaimRef(run_id="run-1", claim_id="c0", model=MODEL, method="work", manifest_uri=uri,
                   results_prefix=prefix, item_count=ITEMS, submitted_at=now)  # fmt: skip
    yield Claim(fake, pq, store, record, pq.send(ref), tmp_path)


def _stop(*workers: tuple[Worker, threading.Thread]) -> None:
    for w, _ in workers:
        w.request_stop("test")
    for _, t in workers:
        t.join(timeout=WAIT)
        assert not t.is_alive()


def _cli_results(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert run(["pool", "results", "run-1", "--model", MODEL, "--bucket", BUCKET]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize(
    "scenario",
    ["heartbeat-notices", "writer-notices", "summary-race"],
)
def test_a_late_attempt_never_replaces_the_completed_results(
    claim: Claim, scenario: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """heartbeat-notices: A's heartbeat sees the lease gone and stops mid-claim, writing nothing.
    writer-notices: A finishes its items after B's Summary and writes its results (the old race),
    then its lease check fails; it cannot even delete them (an orphan, left for ``sweep``).
    summary-race: A passes its lease check, then stalls before its Summary PUT while B takes the
    claim and completes it; A's PUT finds B's Summary and writes nothing over it.
    """
    gate = claim.tmp / "a-may-finish"
    if scenario == "summary-race":
        gate.touch()  # A runs its items at once, and pauses at its Summary PUT
    race, late_write = scenario == "summary-race", scenario == "writer-notices"
    a_s3 = PausableS3(client("s3"), pause_summary=race, refuse_delete=late_write)
    notices = scenario == "heartbeat-notices"
    a = claim.worker("A", a_s3, heartbeat_s=0.2 if notices else 3600.0, gate=str(gate))
    b: tuple[Worker, threading.Thread] | None = None
    try:
        wait_until(lambda: claim.fake.in_flight(), WAIT, "worker A to take the claim")
        a_handle = claim.fake.messages[claim.message_id].handle
        if scenario == "summary-race":
            assert a_s3.at_summary.wait(WAIT), "A never reached its Summary PUT"
        # A misses its heartbeats; SQS hands the claim to B (not back to A), who completes it.
        claim.fake.deliver_to = "worker-B"
        claim.fake.expire(claim.message_id)
        b = claim.worker("B", client("s3"), heartbeat_s=60.0)
        wait_until(lambda: b[0].metrics.get("calque_pool_claims_total", outcome="ok") == 1, WAIT, "B to finish")
        b_summary = claim.store.summaries(claim.record.results_prefix)["c0"]
        assert b_summary.worker_id == "B" and b_summary.attempt == 2
        if notices:
            wait_until(lambda: a[0].metrics.get("calque_pool_leases_lost_total") == 1, WAIT, "A's heartbeat to fail")
        # Now A carries on: it finishes its items (or its paused Summary PUT goes out).
        gate.touch()
        a_s3.release.set()
        a_outcome = {"heartbeat-notices": "lost", "writer-notices": "lost", "summary-race": "duplicate"}[scenario]
        wait_until(
            lambda: a[0].metrics.get("calque_pool_claims_total", outcome=a_outcome) == 1, WAIT, f"A: {a_outcome}"
        )
    finally:
        gate.touch()
        a_s3.release.set()
        _stop(a, *([b] if b else []))

    expected = [{"index": i, "ok": True, "value": {"x": i, "by": "B"}} for i in range(ITEMS)]
    got = claim.store.results(claim.record)
    assert [{"index": r.index, "ok": r.ok, "value": r.value} for r in got] == expected
    assert [{k: g[k] for k in ("index", "ok", "value")} for g in _cli_results(capsys)] == expected
    summary = claim.store.summaries(claim.record.results_prefix)["c0"]
    assert summary == b_summary  # A wrote no Summary over B's
    assert summary.results_key and summary.results_key.startswith("results/c0/2-B-")
    a_key = f"{claim.store.base}/runs/run-1/results/c0/1-A-"
    if scenario == "heartbeat-notices":
        assert a_s3.results_puts == []  # stopped mid-claim: wrote nothing
    else:
        (late,) = a_s3.results_puts  # A's late results went to a key of A's own attempt
        assert late.startswith(a_key)
    orphans = claim.store.orphaned_results(claim.record)
    if scenario == "writer-notices":
        assert [o.split("/", 3)[3] for o in orphans] == a_s3.results_puts  # there, but read by no one
        capsys.readouterr()
        assert run(["pool", "sweep", "run-1", "--model", MODEL, "--bucket", BUCKET, "--dry-run"]) == 0
        assert capsys.readouterr().out.split() == orphans
        assert run(["pool", "sweep", "run-1", "--model", MODEL, "--bucket", BUCKET]) == 0
        assert claim.store.orphaned_results(claim.record) == []
        assert [r.value for r in claim.store.results(claim.record)] == [e["value"] for e in expected]
    else:
        assert orphans == []  # A deleted its own late results (summary-race) or wrote none

    # the queue: only B's delete deleted; A neither summarised nor acked with a live handle
    assert not claim.fake.messages
    assert all(not deleted for h, deleted in claim.fake.delete_calls if h == a_handle)
    assert sum(deleted for _, deleted in claim.fake.delete_calls) == 1
    lost_expected = 0 if scenario == "summary-race" else 1
    assert a[0].metrics.get("calque_pool_leases_lost_total") == lost_expected
    assert a[0].metrics.get("calque_pool_claims_total", outcome="ok") == 0
