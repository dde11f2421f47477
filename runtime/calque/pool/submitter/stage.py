"""Staging a run's claims: manifests PUT on a bounded thread pool, ClaimRefs sent ten to a message batch.

``stage_run`` reads items from any iterable (a list, or a generator that ``.map`` is still
consuming), cuts them into claims of ``batch_size`` items and sends each claim as soon as its
manifest is stored, so the first claims run while later ones are still being staged. A claim is
sent only after its manifest exists (a worker never receives a pointer to nothing). The RunRecord
is written last, when the run's claims are all known; workers never read it, readers
(``calque pool results``) need it complete.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import queue as queue_mod
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

from calque.aws.queue import SEND_BATCH, PoolQueue
from calque.aws.store import RunStore
from calque.models import ClaimRef, Item, Manifest, RunRecord

# Concurrent manifest PUTs: enough to hide S3's round trip, few enough for one client's connection pool.
STAGE_THREADS = 16
# A partial batch of ready claims waits at most this long for more (a slow generator still runs).
_FLUSH_S = 0.05


@dataclass(frozen=True)
class StagedClaim:
    """One claim as sent: its id and the run's item indices it carries (contiguous)."""

    claim_id: str
    first_index: int
    count: int


def stage_run(
    pq: PoolQueue,
    store: RunStore,
    items: Iterable[Item],
    *,
    run_id: str,
    model: str,
    method: str,
    batch_size: int,
    workload_digest: str | None = None,
    on_sent: Callable[[list[StagedClaim]], None] | None = None,
    threads: int = STAGE_THREADS,
    encoding: str = "json",
) -> RunRecord:
    """Stage and send every claim of ``items`` (their ``index`` is their position); then write the RunRecord."""
    prefix = store.run_prefix(run_id)
    now = datetime.now(timezone.utc)
    claims: list[str] = []
    count = 0
    # Claims whose manifest PUT is in flight, in claim order; bounded so a huge iterable is not all
    # held in memory while S3 catches up.
    pending: queue_mod.Queue[tuple[ClaimRef, StagedClaim, cf.Future[str]] | None] = queue_mod.Queue(threads * 4)
    failed: list[BaseException] = []

    def send(batch: list[tuple[ClaimRef, StagedClaim, cf.Future[str]]]) -> None:
        if batch:
            pq.send_batch([ref for ref, _, _ in batch])
            if on_sent:
                on_sent([c for _, c, _ in batch])
            batch.clear()

    def sender() -> None:
        # Sends claims in order as their manifests land: ten to a batch, or fewer after a short wait
        # (a slow generator's first claims run before the rest exist).
        batch: list[tuple[ClaimRef, StagedClaim, cf.Future[str]]] = []
        try:
            while True:
                try:
                    got = pending.get(timeout=_FLUSH_S if batch else None)
                except queue_mod.Empty:
                    send(batch)
                    continue
                if got is None:
                    send(batch)
                    return
                got[2].result()  # a failed PUT raises StoreError: nothing unstored is ever sent
                batch.append(got)
                if len(batch) == SEND_BATCH:
                    send(batch)
        except BaseException as exc:
            failed.append(exc)
            while pending.get() is not None:  # unblock the stager
                pass

    thread = threading.Thread(target=sender, name="calque-stage-send", daemon=True)
    thread.start()
    it = iter(items)
    try:
        with cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="calque-stage") as pool:
            while not failed:
                chunk = list(itertools.islice(it, batch_size))
                if not chunk:
                    break
                claim_id = f"c{len(claims):05d}"
                manifest = Manifest.for_items(
                    run_id=run_id, claim_id=claim_id, model=model, method=method, items=chunk, encoding=encoding
                )
                ref = ClaimRef(
                    run_id=run_id,
                    claim_id=claim_id,
                    model=model,
                    method=method,
                    manifest_uri=store.manifest_uri(prefix, claim_id),
                    results_prefix=prefix,
                    workload_digest=workload_digest,
                    item_count=len(chunk),
                    submitted_at=now,
                )
                put = pool.submit(store.put_manifest, prefix, manifest)
                pending.put((ref, StagedClaim(claim_id, count, len(chunk)), put))
                claims.append(claim_id)
                count += len(chunk)
    finally:
        pending.put(None)
        thread.join()
    if failed:
        raise failed[0]
    record = RunRecord(
        run_id=run_id,
        model=model,
        method=method,
        queue_name=pq.name,
        results_prefix=prefix,
        item_count=count,
        claims=claims,
        workload_digest=workload_digest,
        submitted_at=now,
    )
    store.put_run(record)
    return record
