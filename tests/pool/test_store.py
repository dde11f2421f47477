"""``RunStore``'s results as readers see them: only what a claim's Summary vouches for."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from calque.aws.aws_errors import StoreError
from calque.aws.clients import client
from calque.aws.store import RunStore
from calque.models import ItemResult, RunRecord, Summary

NOW = datetime.now(timezone.utc)


def _summary(claim_id: str, results_key: str | None, worker: str = "w") -> Summary:
    return Summary(
        run_id="r", claim_id=claim_id, model="m", method="f", ok=True, items=1, failed=0, warm_hit=True,
        enter_seconds_paid=0.0, enter_count=1, attempt=1, worker_id=worker, started_at=NOW, finished_at=NOW,
        claim_seconds=0.1, method_seconds=0.1, results_key=results_key,
    )  # fmt: skip


def _res(index: int, value: str) -> list[ItemResult]:
    return [ItemResult(index=index, ok=True, value=value, seconds=0.0)]


@pytest.fixture
def store(moto: str) -> RunStore:
    s3 = client("s3")
    s3.create_bucket(Bucket="store-bucket")
    return RunStore(s3, "store-bucket", "calque", "q")


def test_results_follow_the_summary_and_ignore_unvouched_objects(store: RunStore) -> None:
    prefix = store.run_prefix("r")
    record = RunRecord(run_id="r", model="m", method="f", queue_name="q", results_prefix=prefix, item_count=3,
                       claims=["c0", "c1", "c2"], submitted_at=NOW)  # fmt: skip
    key0 = store.attempt_results_key("c0", 2, "host:12/0", "abcd1234")
    assert key0 == "results/c0/2-host_12_0-abcd1234.jsonl"
    store.put_results(prefix, "c0", _res(0, "vouched"), key0)
    store.put_results(prefix, "c0", _res(0, "late"), store.attempt_results_key("c0", 1, "other", "00000000"))
    store.put_results(prefix, "c0", _res(0, "legacy"))  # results/c0.jsonl: no Summary names it
    assert store.put_summary(prefix, _summary("c0", key0), if_absent=True)
    assert not store.put_summary(prefix, _summary("c0", None, worker="second"), if_absent=True)
    store.put_results(prefix, "c1", _res(1, "older worker"))  # a Summary without results_key: the legacy key
    store.put_summary(prefix, _summary("c1", None))
    store.put_results(prefix, "c2", _res(2, "no summary yet"), store.attempt_results_key("c2", 1, "w", "11111111"))
    assert [(r.index, r.value) for r in store.results(record)] == [(0, "vouched"), (1, "older worker")]
    orphans = sorted(u.rsplit("/results/", 1)[1] for u in store.orphaned_results(record))
    assert orphans == ["c0.jsonl", "c0/1-other-00000000.jsonl"]  # c2 has no Summary: left alone
    assert len(store.sweep(record)) == 2 and store.orphaned_results(record) == []
    assert [(r.index, r.value) for r in store.results(record)] == [(0, "vouched"), (1, "older worker")]


def test_a_summary_naming_results_outside_its_claim_is_refused(store: RunStore) -> None:
    prefix = store.run_prefix("r")
    record = RunRecord(run_id="r", model="m", method="f", queue_name="q", results_prefix=prefix, item_count=1,
                       claims=["c0"], submitted_at=NOW)  # fmt: skip
    store.put_summary(prefix, _summary("c0", "results/c1/1-w-0.jsonl"))
    with pytest.raises(StoreError, match="names results outside its claim"):
        store.results(record)
