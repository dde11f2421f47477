"""Claims SQS dead-lettered (received too often without a Summary: a worker crashed on them each time).

No worker consumes the dead-letter queue, so such a claim would never get a Summary and its items
never a result. ``settle_dead_letters`` gives each one a failed Summary (only if the claim has none)
saying why, then deletes it from the DLQ: readers then list its items as failed, with that reason
(``RunStore.claim_results``). Submitters call it while they wait; ``calque pool status`` and
``calque pool results`` call it too.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from pydantic import ValidationError

from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.models import ClaimRef, Summary

log = logging.getLogger("calque.pool.submitter.deadletter")


def settle_dead_letters(pq: PoolQueue, store: RunStore, *, rounds: int = 10) -> int:
    """Record every dead-lettered claim of this pool as failed; how many were recorded."""
    settled = 0
    for _ in range(rounds):
        messages = pq.receive_dead_letters(10)
        if not messages:
            break
        for m in messages:
            try:
                ref = ClaimRef.model_validate_json(m.get("Body", ""))
            except ValidationError:
                continue  # not a claim of ours to explain: leave it for an operator
            if store.outside_run(ref.run_id, ref.results_prefix, ref.manifest_uri) is not None:
                continue  # another pool's (or a forged) claim: not ours to write a Summary for
            count = m.get("Attributes", {}).get("ApproximateReceiveCount", "?")
            now = datetime.now(timezone.utc)
            summary = Summary(
                run_id=ref.run_id, claim_id=ref.claim_id, model=ref.model, method=ref.method, ok=False,
                error=(f"dead-lettered: received about {count} times without a Summary (each attempt's worker stopped "
                       f"or crashed mid-claim); it is in no queue now"),
                items=ref.item_count, failed=ref.item_count, warm_hit=False, enter_seconds_paid=0.0, enter_count=0,
                attempt=1, worker_id="calque-dead-letter", started_at=ref.submitted_at, finished_at=now,
                claim_seconds=0.0, method_seconds=0.0,
            )  # fmt: skip
            store.put_summary(ref.results_prefix, summary, if_absent=True)
            pq.delete_dead_letter(m["ReceiptHandle"])
            settled += 1
            log.warning("claim %s/%s was dead-lettered: recorded as failed", ref.run_id, ref.claim_id)
    return settled
