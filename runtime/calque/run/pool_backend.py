"""Calls served by pools: each call is a run of claims on the pool's queue, results read back from S3.

``.remote`` is a run of one item; ``.map``/``.starmap`` a run of claims of the pool's batch size,
staged on a background thread while the entrypoint's iterable is still being read (the first claims
run before the last are staged). Results are collected per claim as Summaries appear (one LIST per
poll, the new Summaries and their results fetched concurrently) and handed back as they land; an
endpoint outage is ridden out until the call's timeout. Each run is an ordinary pool run:
``calque pool results RUN --model M`` reads it afterwards.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.errors import InfrastructureError, UsageError
from calque.models import Item, ItemResult, PoolSpec, RunRecord, Summary
from calque.models.ids import is_safe_id
from calque.models.pool import DEFAULT_METHOD
from calque.models.values import TYPED, decode
from calque.pool.submitter.deadletter import settle_dead_letters
from calque.pool.submitter.loads import CHECK_EVERY_S, LoadRecords, PoolHealth, check_loadable, check_method, health
from calque.pool.submitter.stage import StagedClaim, stage_run
from calque.pool.submitter.submit import SETTLE_EVERY_S, PoolTarget, new_run_id
from calque.pool.worker.stream import follow
from calque.run.backend import Target
from calque.run.item_value import value_of
from calque.run.pool_mapping import PoolMap
from calque.run.progress import Tally

_FIRST_POLL_S = 0.02
_MAX_POLL_S = 0.5


@dataclass
class _Pool:
    spec: PoolSpec
    queue: PoolQueue
    store: RunStore
    loads: LoadRecords
    _health: PoolHealth | None = None
    _health_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def health(self) -> PoolHealth:
        """The workers' load records, read at most every ``CHECK_EVERY_S`` (a ``.remote`` loop adds no LISTs)."""
        with self._lock:
            if self._health is None or time.monotonic() - self._health_at >= CHECK_EVERY_S:
                try:
                    self._health = health(self.loads.read())
                except InfrastructureError:  # unreadable for now: nothing known, as before records existed
                    self._health = self._health or PoolHealth()
                self._health_at = time.monotonic()
            return self._health


class PoolRun:
    """One call's run: staged in the background, collected claim by claim."""

    def __init__(self, pool: _Pool, target: Target, items: Iterable[Item] | None, tally: Tally, fetch: cf.Executor,
                 timeout_s: float, record: RunRecord | None = None) -> None:  # fmt: skip
        self.pool, self.target, self.tally, self.fetch = pool, target, tally, fetch
        self.timeout_s = timeout_s
        self.run_id = record.run_id if record else new_run_id()
        self.prefix = pool.store.run_prefix(self.run_id)
        self._claims: dict[str, StagedClaim] = {}
        self._done: set[str] = set()
        self._lock = threading.Lock()
        self._staged = False
        self._stage_error: BaseException | None = None
        self._ended = False
        self._interval = _FIRST_POLL_S
        self._last_progress = time.monotonic()
        self._last_error: InfrastructureError | None = None
        self._next_settle = time.monotonic() + SETTLE_EVERY_S
        self._thread: threading.Thread | None = None
        if record is not None:  # a run staged by another process (FunctionCall.from_id): follow its claims
            self._staged = True
            per = -(-record.item_count // max(len(record.claims), 1))  # every claim but the last is full
            for n, claim_id in enumerate(record.claims):
                first = n * per
                self._claims[claim_id] = StagedClaim(claim_id, first, max(0, min(per, record.item_count - first)))
        elif items is not None:
            self._thread = threading.Thread(target=self._stage, args=(items,), name="calque-run-stage", daemon=True)
            self._thread.start()

    def sent(self) -> None:
        """Wait until every claim is staged and sent (``.spawn_map``); raise what staging raised."""
        if self._thread is not None:
            self._thread.join()
        if self._stage_error is not None:
            raise self._stage_error

    def created(self) -> None:
        """A pool run is found by its RunRecord, written once its claims are sent: wait for that."""
        self.sent()

    def _stage(self, items: Iterable[Item]) -> None:
        try:
            stage_run(self.pool.queue, self.pool.store, items, run_id=self.run_id, model=self.pool.spec.model,
                      method=self.target.method, batch_size=self.pool.spec.batch_size, on_sent=self._sent,
                      encoding=TYPED)  # fmt: skip
        except BaseException as exc:
            self._stage_error = exc
        finally:
            self._staged = True

    def _sent(self, claims: list[StagedClaim]) -> None:
        with self._lock:
            for c in claims:
                self._claims[c.claim_id] = c
        self._last_progress = time.monotonic()
        self.tally.submitted(sum(c.count for c in claims))

    @property
    def finished(self) -> bool:
        return self._ended

    def _collect(self, claim: StagedClaim) -> tuple[Summary, list[ItemResult]] | None:
        s = self.pool.store.get_summary(self.prefix, claim.claim_id)
        if s is None:
            return None
        indices = range(claim.first_index, claim.first_index + claim.count)
        return s, self.pool.store.claim_results(self.prefix, s, indices)

    def _poll(self) -> list[ItemResult]:
        with self._lock:
            known = dict(self._claims)
        new = [known[c] for c in self.pool.store.summary_claims(self.prefix) if c in known and c not in self._done]
        out: list[ItemResult] = []
        for claim, got in zip(new, self.fetch.map(self._collect, new), strict=True):
            if got is None:
                continue
            summary, results = got
            self._done.add(claim.claim_id)
            self.tally.finished(len(results), sum(1 for r in results if not r.ok), summary)
            out += results
        return out

    def wait_some(self, timeout: float) -> list[ItemResult]:
        deadline = time.monotonic() + timeout
        while True:
            if self._stage_error is not None:
                raise self._stage_error
            staged = self._staged
            try:
                got = self._poll()
                self._last_error = None
            except InfrastructureError as exc:  # S3 unreachable for now: the workers may ride it out too
                got, self._last_error = [], exc
            now = time.monotonic()
            if got:
                self._interval, self._last_progress = _FIRST_POLL_S, now
                return got
            if staged and self._stage_error is None and len(self._done) == len(self._claims):
                self._ended = True
                return []
            if now >= self._next_settle:
                self._next_settle = now + SETTLE_EVERY_S
                with contextlib.suppress(InfrastructureError):
                    settle_dead_letters(self.pool.queue, self.pool.store)
            if now - self._last_progress > CHECK_EVERY_S:  # nothing for a while: can the pool load at all?
                check_loadable(self.pool.health(), self.pool.spec.model, waiting=self._queued())
            if now - self._last_progress > self.timeout_s:
                raise InfrastructureError(self._stalled())
            if now >= deadline:
                return []
            time.sleep(min(self._interval, max(0.0, deadline - now)))
            self._interval = min(self._interval * 1.3, _MAX_POLL_S)

    def _queued(self) -> str:
        return f"Run {self.run_id}'s claims stay queued; a worker that loads runs them."

    def _stalled(self) -> str:
        why = f" (last error: {self._last_error})" if self._last_error else ""
        return (
            f"{self.target.label}: no claim of run {self.run_id} finished for {self.timeout_s:g}s "
            f"({len(self._done)} of {len(self._claims)} claims have a Summary){why}. Are workers serving queue "
            f"{self.pool.queue.name}? (calque pool status {_status_args(self.pool.spec)})"
        )


def _pool_name(spec: PoolSpec) -> str:
    """What the pool is called: its name (lab-a/embedder), or its model for a pool named by its model."""
    return spec.pool or spec.model


def _status_args(spec: PoolSpec) -> str:
    return f"--pool {spec.pool} --bucket {spec.bucket}" if spec.pool else f"--model {spec.model} --bucket {spec.bucket}"


class PoolBackend:
    """Routes each target to its pool (``PoolMap``) and runs calls there."""

    def __init__(self, pools: PoolMap, tally: Tally, *, timeout_s: float, local: Any = None) -> None:
        self.pools, self.tally, self.timeout_s = pools, tally, timeout_s
        self._by_queue: dict[str, _Pool] = {}  # two labs' pools may serve one model: a pool is its queue
        self._lock = threading.Lock()
        self._fetch = cf.ThreadPoolExecutor(max_workers=8, thread_name_prefix="calque-run-fetch")
        self._local = local  # for .local(): the same script in-process

    def _pool(self, target: Target) -> _Pool:
        return self._open(self.pools.spec_for(target))

    def _open(self, spec: PoolSpec) -> _Pool:
        with self._lock:
            key = spec.queue_name or spec.model  # a named pool's spec carries its queue's name
            pool = self._by_queue.get(key)
            if pool is None:
                t = PoolTarget.from_spec(spec)
                queue = t.queue()
                queue.url()  # an InfrastructureError naming the queue, before anything is staged
                store = t.store(queue.name)
                pool = self._by_queue[key] = _Pool(spec, queue, store, LoadRecords(store))
        return pool

    def start(self, target: Target, items: Iterable[Item]) -> PoolRun:
        pool = self._pool(target)
        h = pool.health()  # a pool that cannot load, or a method its class lacks: refused before anything is sent
        check_loadable(h, pool.spec.model, waiting=f"Nothing of {target.label} was sent.")
        check_method(h, target.method, target.label, default=DEFAULT_METHOD)
        return PoolRun(pool, target, items, self.tally, self._fetch, self.timeout_s)

    def adopt(self, run_id: str) -> tuple[PoolRun, Target]:
        """The run ``run_id`` on any pool this script's calls may use (its RunRecord says which method)."""
        if not is_safe_id(run_id):
            raise UsageError(f"FunctionCall.from_id({run_id!r}): not a calque run id")
        for spec in self.pools.known_specs():
            pool = self._open(spec)
            record = pool.store.get_run(run_id)
            if record is not None:
                target = Target(record.model, record.method, is_function=True)
                run = PoolRun(pool, target, None, self.tally, self._fetch, self.timeout_s, record=record)
                return run, target
        raise UsageError(
            f"FunctionCall.from_id({run_id!r}): no pool this script uses has a run of that id "
            "(the call's object_id is the run id: calque pool results RUN --model M reads it too)"
        )

    def stream(self, target: Target, item: Item) -> Iterator[Any]:
        """A generator method's values as its worker writes their chunks (a one-item run, claim of one)."""
        pool = self._pool(target)
        h = pool.health()
        check_loadable(h, pool.spec.model, waiting=f"Nothing of {target.label} was sent.")
        check_method(h, target.method, target.label, default=DEFAULT_METHOD)
        run_id = new_run_id()
        self.tally.submitted(1)
        record = stage_run(pool.queue, pool.store, [item], run_id=run_id, model=pool.spec.model,
                           method=target.method, batch_size=1, encoding=TYPED)  # fmt: skip
        ended: list[ItemResult] = []

        def on_result(summary: Summary, result: ItemResult) -> None:
            ended.append(result)
            self.tally.finished(1, 0 if result.ok else 1, summary)

        def check() -> None:
            waiting = f"Run {run_id}'s claim stays queued; a worker that loads runs it."
            check_loadable(pool.health(), pool.spec.model, waiting=waiting)

        values = follow(pool.store, record.results_prefix, record.claims[0], index=item.index,
                        timeout_s=self.timeout_s, on_result=on_result, check=check)  # fmt: skip
        yield from (decode(v, "a value the method yielded") for v in values)
        if ended and not ended[0].ok:
            value_of(ended[0])  # raises the method's exception, after the values it yielded

    def local_callable(self, target: Target) -> Any:
        if self._local is None:
            raise UsageError(f"{target.label}.local() needs the script loaded in this process")
        return self._local.local_callable(target)

    def describe(self) -> str:
        names = sorted({_pool_name(p.spec) for p in self._by_queue.values()})
        return f"on pool{'s' if len(names) > 1 else ''} {', '.join(names)}" if names else "on no pool"

    def close(self) -> None:
        self._fetch.shutdown(wait=False, cancel_futures=True)
        if self._local is not None:
            self._local.close()
