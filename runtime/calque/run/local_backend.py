"""``calque run --local``: every call runs in this process, through the same warm supervisor a worker uses.

Each class (per parameter set) is built and entered once, as on a worker, on first use; its
``@exit`` hooks run when the entrypoint returns. Items go through the supervisor's ``drain``, so a
value or an exception comes back as the same ``ItemResult`` a pool would write: what the entrypoint
sees locally is what it sees on a pool.
"""

from __future__ import annotations

import itertools
import queue as queue_mod
import threading
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from calque.errors import UsageError
from calque.models import Item, ItemResult
from calque.models.values import TYPED, decode
from calque.run.backend import Target
from calque.run.item_value import value_of
from calque.run.progress import Tally
from calque.warm import WarmSupervisor
from calque.warm.loader import build_workload
from calque.warm.streaming import Sink

# Items per drain: the same granularity as a pool's default claim, so progress moves the same way.
_CHUNK = 10


class LocalRun:
    """One call's items, drained on a background thread (``spawn`` runs while the entrypoint goes on)."""

    def __init__(self, sup: WarmSupervisor, method: str, items: Iterable[Item], tally: Tally) -> None:
        self._results: queue_mod.Queue[ItemResult | None] = queue_mod.Queue()
        self._ended = False
        self._error: BaseException | None = None
        self._sup, self._method, self._tally = sup, method, tally
        self._thread = threading.Thread(target=self._produce, args=(iter(items),), name="calque-run-local", daemon=True)
        self._thread.start()

    def _produce(self, items: Any) -> None:
        try:
            while chunk := list(itertools.islice(items, _CHUNK)):
                self._tally.submitted(len(chunk))
                results = self._sup.drain(self._method, chunk, encoding=TYPED).results
                failed = sum(1 for r in results if not r.ok)
                self._tally.finished(len(results), failed)
                for r in results:
                    self._results.put(r)
        except BaseException as exc:  # the entrypoint's iterable raised: the caller sees it
            self._error = exc
        finally:
            self._results.put(None)

    @property
    def finished(self) -> bool:
        return self._ended

    def created(self) -> None:
        """An in-process call is found by its id in this process only, where it exists already."""

    def sent(self) -> None:
        """In-process, an input is sent when it has run: wait for them all."""
        self._thread.join()
        if self._error is not None:
            raise self._error

    def wait_some(self, timeout: float) -> list[ItemResult]:
        out: list[ItemResult] = []
        try:
            got = self._results.get(timeout=timeout)
            while True:
                if got is None:
                    self._ended = True
                    if self._error is not None:
                        raise self._error
                    break
                out.append(got)
                got = self._results.get_nowait()
        except queue_mod.Empty:
            pass
        return out


class LocalBackend:
    """Runs the script's classes and functions in this process."""

    def __init__(self, module: types.ModuleType, path: Path, tally: Tally) -> None:
        self.module, self.path, self.tally = module, path, tally
        self._sups: dict[tuple[str, tuple[tuple[str, Any], ...]], WarmSupervisor] = {}
        self._lock = threading.Lock()

    def _supervisor(self, target: Target) -> WarmSupervisor:
        if target.deployed is not None:
            raise UsageError(
                f"{target.label}: found with from_name({target.deployed!r}, ...), a deployed pool's code; "
                "--local runs only this script's own classes and functions"
            )
        key = (target.name, target.parameters)
        with self._lock:
            sup = self._sups.get(key)
            if sup is None:
                workload = build_workload(self.module, self.path, target.name, dict(target.parameters))
                sup = WarmSupervisor.from_workload(workload)
                self.tally.local_enter_seconds += sup.enter_seconds
                self._sups[key] = sup
        return sup

    def start(self, target: Target, items: Iterable[Item]) -> LocalRun:
        return LocalRun(self._supervisor(target), target.method, items, self.tally)

    def stream(self, target: Target, item: Item) -> Iterator[Any]:
        """The generator's values through the supervisor's chunks, as a pool's worker writes them."""
        sup = self._supervisor(target)
        out: queue_mod.Queue[list[Any] | ItemResult | BaseException] = queue_mod.Queue()

        def produce() -> None:
            try:
                sink: Sink = lambda _i, _n, values: out.put(values)  # noqa: E731
                (result,) = sup.drain(target.method, [item], on_chunk=sink, encoding=TYPED).results
                out.put(result)
            except BaseException as exc:
                out.put(exc)

        self.tally.submitted(1)
        threading.Thread(target=produce, name="calque-run-local-stream", daemon=True).start()
        while True:
            got = out.get()
            if isinstance(got, list):
                yield from (decode(v, "a value the method yielded") for v in got)
                continue
            if isinstance(got, BaseException):
                raise got
            self.tally.finished(1, 0 if got.ok else 1)
            if not got.ok:
                value_of(got)  # raises the method's exception, after the values it yielded
            return

    def adopt(self, run_id: str) -> tuple[LocalRun, Target]:
        raise UsageError(
            f"FunctionCall.from_id({run_id!r}): under --local a call lives only in the run that spawned it, "
            "and this run spawned none of that id"
        )

    def local_callable(self, target: Target) -> Any:
        return self._supervisor(target).workload.methods[target.method].fn

    def describe(self) -> str:
        return "in this process (--local)"

    def close(self) -> None:
        with self._lock:
            sups, self._sups = list(self._sups.values()), {}
        for sup in sups:
            sup.close()
