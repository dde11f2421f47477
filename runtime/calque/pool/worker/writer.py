"""The writer's job: for each finished claim, results, then the Summary, then the delete, in that order.

Writer threads take finished, poison and duplicate claims off the worker's write queue, behind the
next claim's work. A finished claim's results go under this attempt's own key; the lease is
confirmed right before the Summary, which is written only if the claim has none (the first finished
attempt wins, readers follow its ``results_key``); only then is the message deleted. An attempt that
lost its lease can at worst leave an orphaned results object that no Summary names.
"""

from __future__ import annotations

import contextlib
import logging
import queue as queue_mod
from collections.abc import Callable
from dataclasses import dataclass

from calque.aws.aws_errors import StoreError
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.errors import CalqueError
from calque.models import ItemResult, Summary
from calque.models.ids import is_safe_id
from calque.pool.worker.batching import Deleter
from calque.pool.worker.claims import partial_ref
from calque.pool.worker.lease import Lease, Role, State
from calque.pool.worker.summaries import SummaryMaker
from calque.pool.worker.worker_metrics import Metrics

log = logging.getLogger("calque.pool.worker.loop")


@dataclass
class Finished:
    """A drained claim (WRITING) with its results and the Summary that vouches for them."""

    lease: Lease
    results: list[ItemResult]
    summary: Summary


class ClaimWriter:
    """Writes what the runner hands over; one instance shared by the worker's writer threads."""

    def __init__(
        self,
        pool_queue: PoolQueue,
        store: RunStore,
        metrics: Metrics,
        summaries: SummaryMaker,
        *,
        extend: Callable[[Lease, State | None], bool],
        ended: Callable[[Lease], None],
        warm_hit: Callable[[], bool],
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        self.queue = pool_queue
        self.store = store
        self.metrics = metrics
        self.summaries = summaries
        self._extend = extend  # the keeper's extension (LOST when refused)
        self._ended = ended  # the worker stops holding a lease that reached a final state
        self._warm_hit = warm_hit
        # deletes go out behind the writers, ten to a batch (a lease ends when its delete is decided)
        self.deleter = Deleter(pool_queue, ended, busy)
        self.writes: queue_mod.Queue[Finished | Lease | None] = queue_mod.Queue()

    def loop(self, after_write: Callable[[], None]) -> None:
        """A writer thread: until it takes None off the queue."""
        while True:
            item = self.writes.get()
            if item is None:
                return
            try:
                self._one(item, after_write)
            except Exception:  # a writer thread never ends on one claim: it comes back after the VT
                lease = item.lease if isinstance(item, Finished) else item
                log.exception("writing the claim of message %s failed: it will be redelivered", lease.message_id)
                with contextlib.suppress(RuntimeError):  # already final: nothing to hand back
                    lease.advance_unless_taken(State.ABANDONED, Role.WRITER)
                self._ended(lease)

    def _one(self, item: Finished | Lease, after_write: Callable[[], None]) -> None:
        if isinstance(item, Finished):
            self.write(item)
            after_write()
        elif item.state is State.DUPLICATE:
            log.info("claim of message %s already has a Summary: deleting without re-running", item.message_id)
            self.delete(item)
            self.metrics.inc("calque_pool_claims_total", outcome="duplicate")
        else:
            self.write_poison(item)

    def write(self, f: Finished) -> None:
        lease, s = f.lease, f.summary
        assert lease.prepared is not None and s.results_key is not None
        prefix = lease.prepared.ref.results_prefix
        written: str | None = None
        try:
            # Results first, under this attempt's own key: no other attempt writes there, so a late
            # write can orphan an object but never replace results that a Summary vouches for. Then
            # confirm the lease right before the Summary, written only if the claim has none.
            if lease.state is State.WRITING:
                written = self.store.put_results(prefix, s.claim_id, f.results, s.results_key)
            if not self._extend(lease, State.WRITING):
                log.warning("claim %s/%s is no longer ours: no Summary, no delete", s.run_id, s.claim_id)
                self.metrics.inc("calque_pool_claims_total", outcome="lost")
                self._ended(lease)
                self._discard(written)
                return
            outcome = "ok" if s.ok else "failed"
            if not self.store.put_summary(prefix, s, if_absent=True):
                existing = self.store.get_summary(prefix, s.claim_id)
                if existing is None:  # a write in flight lost (S3's 409): let the claim come back
                    raise StoreError(f"the Summary of claim {s.claim_id} is being written by another attempt")
                if existing.results_key != s.results_key:  # not our own retried PUT
                    log.warning(
                        "claim %s/%s was finished by another attempt first: keeping its Summary, dropping ours",
                        s.run_id,
                        s.claim_id,
                    )
                    outcome = "duplicate"
                    self._discard(written)
            self.metrics.inc("calque_pool_claims_total", outcome=outcome)
            lease.advance_unless_taken(State.SUMMARISED, Role.WRITER)
        except CalqueError as exc:
            log.error("cannot write claim %s/%s (%s): it will be redelivered", s.run_id, s.claim_id, exc)
            lease.advance_unless_taken(State.ABANDONED, Role.WRITER)
            self._ended(lease)
            return
        self.delete(lease)

    def write_poison(self, lease: Lease) -> None:
        """A failed Summary (or a poison record when the message names no run), then delete."""
        error = lease.problem or "claim could not be prepared"
        log.error("poison claim in message %s: %s", lease.message_id, error)
        ref = lease.ref
        partial = partial_ref(lease.body)
        run_id = ref.run_id if ref else partial.get("run_id")
        claim_id = ref.claim_id if ref else partial.get("claim_id")
        prefix = ref.results_prefix if ref else partial.get("results_prefix")
        count = ref.item_count if ref else partial.get("item_count")
        items = count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else 0
        try:
            # the failed Summary goes where the submitter looks, only if that is this pool's own key
            # for safe ids; anything else (a crafted ../ id, another prefix) gets a poison record
            if is_safe_id(run_id) and is_safe_id(claim_id) and prefix == self.store.run_prefix(str(run_id)):
                summary = self.summaries.make(
                    ref,
                    lease,
                    ok=False,
                    error=error,
                    items=items,
                    failed=items,
                    warm_hit=self._warm_hit(),
                    enter_paid=0.0,
                    started_at=lease.received_at,
                    claim_seconds=0.0,
                    method_seconds=0.0,
                    run_id=str(run_id),
                    claim_id=str(claim_id),
                    method=str(partial.get("method") or ""),
                )
                if not self.store.put_summary(str(prefix), summary, if_absent=True):
                    log.info("claim of message %s already has a Summary: deleting it", lease.message_id)
            else:
                self.store.put_poison(lease.message_id, lease.body, error)
        except CalqueError as exc:
            log.error("cannot record poison claim %s (%s): leaving it for the DLQ", lease.message_id, exc)
            lease.advance_unless_taken(State.ABANDONED, Role.WRITER)
            self._ended(lease)
            return
        self.metrics.inc("calque_pool_claims_total", outcome="poison")
        if lease.advance_unless_taken(State.SUMMARISED, Role.WRITER):
            self.delete(lease)
        else:
            self._ended(lease)

    def delete(self, lease: Lease) -> None:
        """Delete the message of a SUMMARISED or DUPLICATE lease (queued for the deleter)."""
        self.deleter.put(lease)

    def _discard(self, uri: str | None) -> None:
        """Best effort: delete this attempt's orphaned results (unread either way; ``sweep`` finds leftovers)."""
        if uri is None:
            return
        try:
            self.store.delete(uri)
        except CalqueError as exc:
            log.info("left orphaned results %s (%s): nothing reads them", uri, exc)
