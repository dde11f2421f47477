"""The verdict a worker reads from a claim's crash marks, against moto S3: only witnessed deaths count."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from calque.aws.clients import client
from calque.aws.store import RunStore
from calque.models import ClaimRef
from calque.models.poolcrash import CrashMark
from calque.pool.worker.crashes import mark_uri, record_death, verdict

BUCKET = "marks-bucket"


def _store_and_ref() -> tuple[RunStore, ClaimRef]:
    s3 = client("s3")
    s3.create_bucket(Bucket=BUCKET)
    store = RunStore(s3, BUCKET, "calque", "q")
    prefix = store.run_prefix("run-1")
    ref = ClaimRef(run_id="run-1", claim_id="c00003", model="org/m", method="work",
                   manifest_uri=f"{prefix}manifests/c00003.json", results_prefix=prefix, item_count=5,
                   submitted_at=datetime.now(timezone.utc))  # fmt: skip
    return store, ref


def _witnessed(store: RunStore, ref: ClaimRef, attempt: int, cause: str = "killed by SIGSEGV") -> None:
    mark = CrashMark(claim_id=ref.claim_id, attempt=attempt, worker_id=f"h:{100 + attempt}", items=[17],
                     cause=cause, at=datetime.now(timezone.utc))  # fmt: skip
    record_death(store, ref.results_prefix, mark)


def test_two_witnessed_deaths_poison_the_claim_naming_the_item_and_each_cause(moto: str) -> None:
    store, ref = _store_and_ref()
    assert verdict(store, ref, 2, max_runs=5) is None  # nothing marked
    _witnessed(store, ref, 1)
    assert verdict(store, ref, 2, max_runs=5) is None  # one death: it runs again
    _witnessed(store, ref, 2, "exited with code 3")
    said = verdict(store, ref, 3, max_runs=5)
    assert said is not None and said.startswith("this claim ended two workers while its item 17 ran (")
    assert "attempt 1 on worker h:101: killed by SIGSEGV; attempt 2 on worker h:102: exited with code 3" in said
    assert "it is not offered to a third. Run item 17 with calque run --local to see why" in said
    assert verdict(store, ref, 2, max_runs=5) is None  # a mark of this attempt or later is not evidence for it


def test_an_unwitnessed_mark_is_no_evidence_and_max_receive_count_counts_the_deaths(moto: str) -> None:
    store, ref = _store_and_ref()
    # what a worker before witnesses wrote when it took a redelivered claim, whether it died running it or not
    old = json.dumps({"worker_id": "h:1", "attempt": 2, "reason": ""}).encode()
    store.put(mark_uri(ref.results_prefix, ref.claim_id, 2), old)
    _witnessed(store, ref, 1)
    assert verdict(store, ref, 3, max_runs=5) is None
    said = verdict(store, ref, 3, max_runs=1)  # one run allowed, and one already ended its worker
    assert said is not None and "this claim's item 17 ended a worker" in said
    assert "the pool's max_receive_count 1 lets no more attempts run" in said
