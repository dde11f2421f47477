"""Submitting a run to a pool, waiting for it, and reading its results back.

``submit`` validates the items, stages one Manifest per claim of ``batch_size`` items (so several
workers share a large run), writes the RunRecord, then sends one ClaimRef per claim. ``wait``
polls the run's Summaries; ``report`` folds them into a RunReport with the cost line's figures.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.errors import InfrastructureError, UsageError
from calque.models import Item, ItemResult, PoolSpec, RunRecord, RunReport, Summary
from calque.models.ids import RULE, is_safe_id
from calque.models.pool import DEFAULT_METHOD
from calque.pool.cost import run_cost
from calque.pool.submitter.deadletter import settle_dead_letters
from calque.pool.submitter.loads import (
    CHECK_EVERY_S,
    LoadRecords,
    PoolLoadError,
    check_loadable,
    check_method,
    health,
    pool_health,
)
from calque.pool.submitter.stage import STAGE_THREADS, stage_run

# How often a waiting submitter looks in the dead-letter queue for claims that will never finish.
SETTLE_EVERY_S = 10.0
# What a submitter that stops waiting on a pool that cannot load says about the claims it sent.
_QUEUED = "The run's claims stay queued; a worker that loads runs them (calque pool results {run} reads them)."


@dataclass(frozen=True)
class PoolTarget:
    """Where a pool lives: its model (hence queue) and the bucket/prefix of its runs."""

    model: str
    bucket: str
    prefix: str = "calque"
    region: str | None = None
    endpoint_url: str | None = None
    profile: str | None = None
    queue_name: str | None = None

    @classmethod
    def from_spec(cls, spec: PoolSpec, profile: str | None = None) -> PoolTarget:
        return cls(spec.model, spec.bucket, spec.prefix, spec.region, spec.endpoint_url, profile, spec.queue_name)

    def queue(self) -> PoolQueue:
        sqs = client("sqs", region=self.region, endpoint_url=self.endpoint_url, profile=self.profile)
        return PoolQueue(sqs, self.model, self.queue_name)

    def store(self, queue_name: str) -> RunStore:
        # one connection per staging thread (and a few for readers), so concurrent PUTs never queue on the pool
        s3 = client(
            "s3",
            region=self.region,
            endpoint_url=self.endpoint_url,
            profile=self.profile,
            max_pool_connections=STAGE_THREADS + 8,
        )
        return RunStore(s3, self.bucket, self.prefix, queue_name)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number: JSON cannot carry it faithfully")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is beyond a double's range and would arrive as infinity")
    return value


def parse_item_line(line: str) -> Any:
    """One JSON value; NaN, Infinity and numbers beyond a double's range are refused (ValueError), never nulled."""
    return json.loads(line, parse_constant=_refuse_constant, parse_float=_finite_float)


def read_items(path: str | Path) -> list[Item]:
    """Items from JSONL: ``{"args": [...], "kwargs": {...}}`` per line, or any other JSON value as the one argument."""
    items: list[Item] = []
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read items file {path}: {exc}") from exc
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        where = raw[: exc.start].count(b"\n") + 1
        raise UsageError(
            f"{path} is not UTF-8 text (line {where}, byte {exc.start}: {exc.reason}): save it as UTF-8"
        ) from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            doc: Any = parse_item_line(line)
        except ValueError as exc:
            raise UsageError(f"{path} line {n} is not JSON ({exc}): write one JSON value per line") from None
        if isinstance(doc, dict) and doc and set(doc) <= {"args", "kwargs"}:
            try:
                items.append(Item(index=len(items), args=doc.get("args", []), kwargs=doc.get("kwargs", {})))
            except ValidationError as exc:
                raise UsageError(f"{path} line {n}: 'args' must be a list and 'kwargs' an object") from exc
        else:
            items.append(Item(index=len(items), args=[doc]))
    if not items:
        raise UsageError(f"{path} has no items: write one JSON value per line")
    return items


def new_run_id() -> str:
    return f"run-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


def submit(
    target: PoolTarget,
    items: list[Item],
    *,
    method: str | None = None,
    batch_size: int = 10,
    workload_digest: str | None = None,
    run_id: str | None = None,
) -> RunRecord:
    """Stage one manifest per claim and send its ClaimRef (``stage_run``), then the RunRecord. Returns it."""
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {batch_size}")
    pq = target.queue()
    pq.url()  # InfrastructureError naming the queue looked for, before anything is staged
    store = target.store(pq.name)
    run_id = run_id or new_run_id()
    if not is_safe_id(run_id):
        raise UsageError(f"run id {run_id!r} cannot name S3 keys: use {RULE}")
    # The workers' load records: a pool that cannot load, or a method its class lacks, sends nothing.
    health = pool_health(store)
    check_loadable(health, target.model, waiting="Nothing was sent.")
    check_method(health, method or DEFAULT_METHOD, f"--method {method}", default=DEFAULT_METHOD)
    return stage_run(
        pq,
        store,
        items,
        run_id=run_id,
        model=target.model,
        method=method or DEFAULT_METHOD,
        batch_size=batch_size,
        workload_digest=workload_digest,
    )


def load_run(target: PoolTarget, run_id: str) -> tuple[RunStore, RunRecord]:
    if not is_safe_id(run_id):
        raise UsageError(f"run id {run_id!r} is not one calque makes: run ids are {RULE}")
    pq_name = target.queue_name or PoolQueue(None, target.model).name
    store = target.store(pq_name)
    record = store.get_run(run_id)
    if record is None:
        raise UsageError(
            f"no run {run_id!r} for model {target.model!r} under s3://{target.bucket}/{store.base}/runs/: "
            "check the run id, --model and --bucket"
        )
    return store, record


def report(record: RunRecord, summaries: dict[str, Summary]) -> RunReport:
    """Fold a run's Summaries into its report (a partial report while claims are missing)."""
    done = [summaries[c] for c in record.claims if c in summaries]
    items_done = sum(s.items for s in done)
    failed = sum(s.failed for s in done)
    wall = 0.0
    if done:
        wall = max(0.0, (max(s.finished_at for s in done) - record.submitted_at).total_seconds())
    return RunReport(
        run_id=record.run_id,
        model=record.model,
        method=record.method,
        queue_name=record.queue_name,
        finished=len(done) == len(record.claims),
        claims=len(record.claims),
        claims_done=len(done),
        claims_failed=sum(1 for s in done if not s.ok),
        items=record.item_count,
        items_ok=items_done - failed,
        items_failed=failed,
        warm_hits=sum(1 for s in done if s.warm_hit),
        enter_seconds_paid=round(sum(s.enter_seconds_paid for s in done), 6),
        wall_seconds=round(wall, 6),
        items_per_second=round(items_done / wall, 3) if wall > 0 else None,
        cost=run_cost(done),
        errors=[f"{s.claim_id}: {s.error}" for s in done if s.error],
    )


def wait(
    store: RunStore,
    record: RunRecord,
    *,
    timeout_s: float,
    on_progress: Callable[[int, int], None] | None = None,
    queue: PoolQueue | None = None,
) -> RunReport:
    """Poll until every claim has a Summary or ``timeout_s`` passes; returns the (maybe partial) report.

    S3 failing while we wait (an endpoint outage, a throttle) is ridden out with backoff until the
    timeout: the workers may well survive it and finish the run.
    """
    deadline = time.monotonic() + timeout_s
    interval = 0.1
    total = len(record.claims)
    last_error: InfrastructureError | None = None
    next_settle = time.monotonic() + SETTLE_EVERY_S
    loads, next_load_check = LoadRecords(store), time.monotonic()
    while True:
        try:
            if queue is not None and time.monotonic() >= next_settle:
                next_settle = time.monotonic() + SETTLE_EVERY_S
                settle_dead_letters(queue, store)  # a dead-lettered claim of this run gets its failed Summary
            count = store.summary_count(record.results_prefix)
            if count < total and time.monotonic() >= next_load_check:
                next_load_check = time.monotonic() + CHECK_EVERY_S
                check_loadable(health(loads.read()), record.model, waiting=_QUEUED.format(run=record.run_id))
            last_error = None
        except PoolLoadError:
            raise
        except InfrastructureError as exc:
            last_error, count = exc, -1
        if on_progress and count >= 0:
            on_progress(min(count, total), total)
        if count >= total or time.monotonic() >= deadline:
            break
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
        interval = min(interval * 1.5, 2.0)
    try:
        return report(record, store.summaries(record.results_prefix))
    except InfrastructureError as exc:
        raise InfrastructureError(
            f"run {record.run_id}: cannot read its Summaries after waiting {timeout_s:g}s: {last_error or exc}"
        ) from exc


def results(store: RunStore, record: RunRecord, *, failed_only: bool = False) -> list[ItemResult]:
    out = store.results(record)
    return [r for r in out if not r.ok] if failed_only else out


def check_finished(rep: RunReport, timeout_s: float) -> None:
    if not rep.finished:
        raise InfrastructureError(
            f"run {rep.run_id} not finished after {timeout_s:g}s: {rep.claims_done} of {rep.claims} claims have a "
            f"Summary. Are workers serving queue {rep.queue_name}? (calque pool status --model ...)"
        )
