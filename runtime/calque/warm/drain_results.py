"""What draining a claim's items produces: the ``Drain`` of one call, a claim failed whole, an item's
error as calque records it (type, message, traceback), and a value as ``calque pool submit``'s plain
JSON. ``supervisor.py`` builds them; the pool worker reads them.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_jsonable_python

from calque.models import Item, ItemError, ItemResult
from calque.models.values import type_name
from calque.warm.loader import Workload


@dataclass
class Drain:
    """What one call of ``drain`` produced."""

    results: list[ItemResult]
    method_seconds: float
    stopped: str | None = None  # "lost" | "shutdown" (results partial, discard) or "deadline"
    error: str | None = None


def failed_drain(items: Sequence[Item], reason: str) -> Drain:
    """A claim that could not be drained at all: every item failed with ``reason``, the claim too."""
    err = ItemError(type="calque.ClaimFailed", message=reason)
    results = [ItemResult(index=it.index, ok=False, error=err, seconds=0.0) for it in items]
    return Drain(results=results, method_seconds=0.0, error=reason)


def item_error(exc: BaseException, script: Workload | None = None) -> ItemError:
    t = type(exc)
    name = type_name(t)
    if script is not None and t.__module__ == script.module_name:
        # the script's own class, named relative to the script: the caller imported it under another
        # module name (``calque.run.item_value`` finds it in its own copy of the script)
        name = f"{script.path.name}::{t.__qualname__}"
    try:
        message = str(exc)
    except Exception as err:  # an exception whose __str__ raises still fails only its item
        message = f"<str() of the exception raised {type(err).__name__}>"
    return ItemError(
        type=name, message=message, traceback="".join(traceback.format_exception(t, exc, exc.__traceback__))
    )


def plain_json(value: Any, where: str) -> Any:
    """``calque pool submit``'s results: plain JSON (a tuple as a list), as before typed values existed."""
    try:
        return to_jsonable_python(value)
    except Exception as exc:
        raise TypeError(
            f"{where}: the method returned a {type_name(type(value))}, which is not JSON-serialisable ({exc})"
        ) from None
