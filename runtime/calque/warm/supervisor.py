"""``WarmSupervisor``: enter once, drain many claims' items, exit once.

Sync methods run on a thread pool of the class's ``max_inputs`` (1 unless ``@modal.concurrent`` or
``allow_concurrent_inputs`` says more; with 1, ``@enter`` and every method share one thread, so
thread-bound state such as a SQLite connection made in ``@enter`` keeps working). Async methods and
hooks run as tasks on one persistent event loop. ``@modal.batched`` methods receive lists of up to
``max_batch_size`` items (a claim's items are all known, so ``wait_ms`` never needs to wait).
A per-item timeout and a per-claim deadline bound the work; a failing item is recorded with its
exception type, message and traceback and the claim goes on. Values cross as the claim's
``encoding`` says (``calque.models.values``); an argument that cannot be read or a value that cannot
be carried fails its own item, never the claim or the worker. The threads are ``thread_pool.py``'s;
what a drain produces is ``drain_results.py``'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from calque.errors import UsageError
from calque.models import Item, ItemResult, PoolSpec
from calque.models.values import TYPED, decode, encode
from calque.warm.calls import mark_remote_thread
from calque.warm.drain_results import Drain, item_error, plain_json
from calque.warm.loader import MethodInfo, Workload, WorkloadError, load_workload
from calque.warm.streaming import Sink, generator_runner
from calque.warm.thread_pool import DaemonThreadPool

_POLL_S = 0.05


class EnterError(UsageError):
    """``@enter`` (or ``@build``) raised: the worker cannot serve this workload."""


@dataclass
class _Unit:
    items: list[Item]
    future: cf.Future[Any] | None = None
    started: float = 0.0
    batched: bool = False
    cut: Callable[[], None] | None = None  # a generator's: ends its stream when it is abandoned
    typed: bool = False  # values cross in calque.models.values' encoding (calque run), else plain JSON


@dataclass
class WarmSupervisor:
    """One loaded, entered workload. Build it with ``WarmSupervisor.load``."""

    workload: Workload
    item_timeout_s: float | None = None
    claim_deadline_s: float | None = None
    exit_timeout_s: float = 30.0
    enter_seconds: float = 0.0
    enter_count: int = 0
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _pool: DaemonThreadPool | None = None
    _closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- building ---------------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        spec: PoolSpec | str,
        parameters: dict[str, Any] | None = None,
        *,
        item_timeout_s: float | None = None,
        claim_deadline_s: float | None = None,
    ) -> WarmSupervisor:
        """Import the workload (a PoolSpec, or ``"script.py[::Class]"``) and run its ``@enter`` once."""
        if isinstance(spec, PoolSpec):
            workload, params = spec.workload, {**spec.parameters, **(parameters or {})}
            item_timeout_s = item_timeout_s or spec.item_timeout_s
            claim_deadline_s = claim_deadline_s or spec.claim_deadline_s
        else:
            workload, params = spec, dict(parameters or {})
        return cls.from_workload(
            load_workload(workload, params), item_timeout_s=item_timeout_s, claim_deadline_s=claim_deadline_s
        )

    @classmethod
    def from_workload(
        cls, workload: Workload, *, item_timeout_s: float | None = None, claim_deadline_s: float | None = None
    ) -> WarmSupervisor:
        """Enter an already built ``Workload`` once (``calque run --local`` builds its own from a module).

        If ``@enter`` raises, the supervisor is closed without ``@exit`` and the ``EnterError`` propagates.
        """
        sup = cls(workload, item_timeout_s=item_timeout_s, claim_deadline_s=claim_deadline_s)
        sup._start()
        try:
            sup._enter()
        except BaseException:
            sup.close(run_exit=False)
            raise
        return sup

    def _start(self) -> None:
        def serve_loop() -> None:
            mark_remote_thread()
            self._loop.run_forever()

        threading.Thread(target=serve_loop, name="calque-warm-loop", daemon=True).start()
        self._pool = DaemonThreadPool(self.workload.max_inputs, "calque-warm")

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        if asyncio.iscoroutinefunction(fn):
            return asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), self._loop)
        assert self._pool is not None
        return self._pool.submit(fn, *args, **kwargs)

    def _enter(self) -> None:
        started = time.monotonic()
        for hook in [*self.workload.build, *self.workload.enter_snap, *self.workload.enter]:
            try:
                result = self._call(hook).result()
                if asyncio.iscoroutine(result):  # a sync def that returns a coroutine (rare)
                    asyncio.run_coroutine_threadsafe(result, self._loop).result()
            except Exception as exc:
                name = getattr(hook, "__qualname__", repr(hook))
                tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                raise EnterError(f"{name} raised {type(exc).__name__}: {exc}\n{tb}") from exc
        self.enter_seconds = time.monotonic() - started
        self.enter_count += 1

    # -- reading ----------------------------------------------------------------------------------

    @property
    def digest(self) -> str:
        return self.workload.digest

    @property
    def methods(self) -> list[str]:
        return sorted(self.workload.methods)

    def default_method(self) -> str | None:
        return next(iter(self.workload.methods)) if len(self.workload.methods) == 1 else None

    # -- draining ---------------------------------------------------------------------------------

    def run(self, method: str, items: Sequence[Item]) -> list[ItemResult]:
        """Run ``method`` over ``items``; one ItemResult per item finished, in item order."""
        return self.drain(method, items).results

    def drain(
        self,
        method: str,
        items: Sequence[Item],
        *,
        should_stop: Callable[[], str | None] | None = None,
        on_result: Callable[[ItemResult], None] | None = None,
        on_chunk: Sink | None = None,
        on_start: Callable[[list[int]], None] | None = None,
        encoding: str = "json",
    ) -> Drain:
        """Like ``run``, stopping early when ``should_stop()`` returns a reason ('lost', 'shutdown').

        ``on_start`` hears the indices of every item in flight each time new ones start (a pool
        worker's witness marks them if the process dies while they run).

        A generator method's values go to ``on_chunk`` in numbered chunks while it runs, and its
        item's value is ``{"chunks": k, "values": n}``; with no ``on_chunk``, the list of its values.
        """
        info = self.workload.methods.get(method)
        if info is None:
            raise WorkloadError(f"{self.workload.target_name} has no method {method!r} (it has {self.methods})")
        if self._closed:
            raise UsageError("this WarmSupervisor is closed")
        units = deque(self._units(info, list(items), encoding == TYPED))
        inflight: list[_Unit] = []
        done: dict[int, ItemResult] = {}
        method_seconds = 0.0
        started = time.monotonic()
        stopped: str | None = None
        while units or inflight:
            reason = should_stop() if should_stop else None
            if reason:
                stopped = reason
                break
            if self.claim_deadline_s is not None and time.monotonic() - started > self.claim_deadline_s:
                stopped = "deadline"
                break
            while units and len(inflight) < self.workload.max_inputs:
                u = units.popleft()
                u.started = time.monotonic()
                if on_start is not None:  # before the call: a unit that ends the process at once is named
                    on_start([it.index for v in [*inflight, u] for it in v.items])
                u.future = self._submit(info, u, on_chunk)
                inflight.append(u)
            cf.wait([u.future for u in inflight if u.future], timeout=_POLL_S, return_when=cf.FIRST_COMPLETED)
            now = time.monotonic()
            for u in list(inflight):
                assert u.future is not None
                timed_out = self.item_timeout_s is not None and now - u.started > self.item_timeout_s
                if not u.future.done() and not timed_out:
                    continue
                inflight.remove(u)
                elapsed = now - u.started
                method_seconds += elapsed
                if u.future.done():
                    new = self._results_of(info, u, elapsed)
                else:
                    self._abandon(u, info)
                    err = TimeoutError(f"item took longer than the pool's item_timeout_s={self.item_timeout_s}")
                    new = [self._failed(it, err, elapsed / len(u.items)) for it in u.items]
                for r in new:
                    done[r.index] = r
                    if on_result:
                        on_result(r)
        error = None
        if stopped == "deadline":
            error = f"claim deadline of {self.claim_deadline_s}s passed with {len(units) + len(inflight)} unit(s) left"
            late = TimeoutError(f"the claim deadline ({self.claim_deadline_s}s) passed before this item finished")
            for u in [*inflight, *units]:
                if u.future is not None:
                    self._abandon(u, info)
                for it in u.items:
                    done[it.index] = self._failed(it, late, 0.0)
        elif stopped:
            for u in inflight:
                self._abandon(u, info)
        ordered = [done[i.index] for i in items if i.index in done]
        return Drain(results=ordered, method_seconds=method_seconds, stopped=stopped, error=error)

    def _units(self, info: MethodInfo, items: list[Item], typed: bool) -> list[_Unit]:
        if info.batched is None:
            return [_Unit([it], typed=typed) for it in items]
        size = info.batched[0]
        return [_Unit(items[i : i + size], batched=True, typed=typed) for i in range(0, len(items), size)]

    def _arguments(self, info: MethodInfo, u: _Unit) -> list[Item]:
        if not u.typed:
            return u.items
        where = f"an argument of {info.name}"
        return [Item(index=it.index, args=decode(it.args, where), kwargs=decode(it.kwargs, where)) for it in u.items]

    def _submit(self, info: MethodInfo, u: _Unit, on_chunk: Sink | None = None) -> cf.Future[Any]:
        try:
            items = self._arguments(info, u)
        except TypeError as exc:  # an argument that cannot be read fails its items, not the claim
            failed: cf.Future[Any] = cf.Future()
            failed.set_exception(exc)
            return failed
        if info.is_generator:
            where = f"a value {info.name} yielded"
            carry = (lambda v: encode(v, where)) if u.typed else (lambda v: plain_json(v, where))
            run, u.cut = generator_runner(info.fn, items[0], on_chunk, is_async=info.is_async, carry=carry)
            return self._call(run)
        if not u.batched:
            it = items[0]
            return self._call(info.fn, *it.args, **it.kwargs)
        first = items[0]
        shape = (len(first.args), sorted(first.kwargs))
        if any((len(it.args), sorted(it.kwargs)) != shape for it in items):
            f: cf.Future[Any] = cf.Future()
            f.set_exception(TypeError("a batched method needs the same arguments on every item of a batch"))
            return f
        args = [[it.args[j] for it in items] for j in range(shape[0])]
        kwargs = {k: [it.kwargs[k] for it in items] for k in shape[1]}
        return self._call(info.fn, *args, **kwargs)

    def _results_of(self, info: MethodInfo, u: _Unit, elapsed: float) -> list[ItemResult]:
        assert u.future is not None
        per = elapsed / len(u.items)
        if u.future.cancelled():
            cancelled = RuntimeError("the item was cancelled before it ran (its thread pool was replaced)")
            return [self._failed(it, cancelled, per) for it in u.items]
        exc = u.future.exception()
        if exc is not None:
            return [self._failed(it, exc, per) for it in u.items]
        value = u.future.result()
        if not u.batched:
            return [self._ok(u.items[0], value, per, u.typed, info.name)]
        if not isinstance(value, (list, tuple)) or len(value) != len(u.items):
            got = f"{len(value)} values" if isinstance(value, (list, tuple)) else type(value).__name__
            err = TypeError(f"batched method {info.name} returned {got} for {len(u.items)} inputs")
            return [self._failed(it, err, per) for it in u.items]
        return [self._ok(it, v, per, u.typed, info.name) for it, v in zip(u.items, value, strict=True)]

    def _ok(self, item: Item, value: Any, seconds: float, typed: bool, method: str) -> ItemResult:
        where = f"the value {method} returned"
        try:
            carried = encode(value, where) if typed else plain_json(value, where)
            return ItemResult(index=item.index, ok=True, value=carried, seconds=seconds)
        except Exception as exc:  # whatever the value is, it fails its own item only
            return self._failed(item, exc, seconds)

    def _failed(self, item: Item, exc: BaseException, seconds: float) -> ItemResult:
        return ItemResult(index=item.index, ok=False, error=item_error(exc, self.workload), seconds=seconds)

    def _abandon(self, u: _Unit, info: MethodInfo) -> None:
        assert u.future is not None
        if u.cut is not None:  # nothing it yields from now on is kept; its next value ends it
            u.cut()
        if u.future.cancel() or info.is_async:
            return
        # A sync call cannot be interrupted: leave its thread behind and serve on a fresh pool so
        # the next items do not queue behind it.
        old = self._pool
        self._pool = DaemonThreadPool(self.workload.max_inputs, "calque-warm")
        if old is not None:
            old.shutdown()

    # -- closing ----------------------------------------------------------------------------------

    def close(self, *, run_exit: bool = True) -> list[str]:
        """Run ``@exit`` hooks once (each bounded by ``exit_timeout_s``); returns their errors."""
        with self._lock:
            if self._closed:
                return []
            self._closed = True
        errors: list[str] = []
        if run_exit:
            for hook in self.workload.exit:
                try:
                    self._call(hook).result(timeout=self.exit_timeout_s)
                except Exception as exc:
                    errors.append(f"{getattr(hook, '__qualname__', hook)}: {type(exc).__name__}: {exc}")
        if self._pool is not None:
            self._pool.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        return errors

    def __enter__(self) -> WarmSupervisor:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
