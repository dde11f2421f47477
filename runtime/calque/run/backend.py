"""What a proxy calls: a ``Backend`` starts runs of items for a target and hands results back.

Two backends implement it: ``PoolBackend`` (claims on the pool's queue, results from S3) and
``LocalBackend`` (``--local``: the same items through an in-process warm supervisor). Both return
``ItemResult``s, so values and exceptions come back the same way whichever ran them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from calque.models import Item, ItemResult


@dataclass(frozen=True)
class Target:
    """One callable of the script: a class's method (with its parameters) or an ``@app.function``."""

    name: str  # the class or function name in the script
    method: str  # what a claim names: the method, or the function's name
    parameters: tuple[tuple[str, Any], ...] = ()
    is_function: bool = False
    deployed: str | None = None  # the pool's name when found with Cls/Function.from_name (no script class here)

    @property
    def label(self) -> str:
        return self.name if self.is_function else f"{self.name}.{self.method}"


class Run(Protocol):
    """One call's items in flight."""

    @property
    def finished(self) -> bool:
        """Every item's result has been handed out by ``wait_some``."""

    def wait_some(self, timeout: float) -> list[ItemResult]:
        """Results that finished since the last call (any order), waiting up to ``timeout`` for one."""

    def sent(self) -> None:
        """Wait until every item is sent (``.spawn_map``); raises what sending raised."""

    def created(self) -> None:
        """Wait until the call can be found by its id from another process (``.spawn``, as Modal's returns)."""


class Backend(Protocol):
    def start(self, target: Target, items: Iterable[Item]) -> Run:
        """Start running ``items`` (their index is their position); the iterable may still be growing."""

    def stream(self, target: Target, item: Item) -> Iterator[Any]:
        """A generator method's values for one call, in order, as they are produced (its exception at the end)."""

    def adopt(self, run_id: str) -> tuple[Run, Target]:
        """A run started elsewhere (``FunctionCall.from_id``), followed from here; UsageError when unknown."""

    def local_callable(self, target: Target) -> Any:
        """The target as an in-process callable (an entered instance's bound method, or the function)."""

    def describe(self) -> str:
        """Where calls run, for the closing summary line."""

    def close(self) -> None:
        """Run ``@exit`` hooks of anything entered in-process; stop background work."""
