"""A run's use-cases as ``calque pool submit --wait`` and ``calque pool results`` ask for them.

``submit_and_wait`` submits items and waits for every claim's Summary (the run's report, maybe
partial at the timeout); ``settled_results`` reads a run's ItemResults after recording its
dead-lettered claims as failed. The CLI (``cli/pool_runs.py``) only renders what they return: it
builds no client and settles nothing itself. The steps are ``calque.pool.submitter.submit``'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from calque.errors import InfrastructureError

if TYPE_CHECKING:
    from calque.models import Item, ItemResult, RunRecord, RunReport
    from calque.pool.submitter.submit import PoolTarget


def submit_and_wait(
    target: PoolTarget,
    items: list[Item],
    *,
    method: str | None,
    batch_size: int,
    workload_digest: str | None,
    timeout_s: float,
    on_submitted: Callable[[RunRecord], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> RunReport:
    """Submit ``items``, then wait up to ``timeout_s`` for the run's Summaries (dead letters count as failed)."""
    from calque.pool.submitter import submit as core

    record = core.submit(target, items, method=method, batch_size=batch_size, workload_digest=workload_digest)
    if on_submitted is not None:
        on_submitted(record)
    store = target.store(record.queue_name)
    return core.wait(store, record, timeout_s=timeout_s, on_progress=on_progress, queue=target.queue())


def settled_results(target: PoolTarget, run_id: str) -> tuple[RunRecord, list[ItemResult]]:
    """Run ``run_id``'s record and its ItemResults in item order, its dead-lettered claims recorded first."""
    from calque.pool.submitter import submit as core
    from calque.pool.submitter.deadletter import settle_dead_letters

    store, record = core.load_run(target, run_id)
    with contextlib.suppress(InfrastructureError):  # the queue may be gone; its runs' results stay readable
        settle_dead_letters(target.queue(), store)
    return record, core.results(store, record)
