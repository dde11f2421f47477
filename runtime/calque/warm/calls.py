"""Pieces of the stand-in ``modal`` that ``calque run`` needs: ``modal.FunctionCall``, lookups, remote threads.

``modal.FunctionCall.gather(*calls)`` waits for calls ``.spawn`` made; ``FunctionCall.from_id(id)``
asks ``calque run``'s dispatcher for the call of that id, and ``Cls.from_name``/``Function.from_name``
for a deployed pool (on a worker there is no dispatcher: refused).
A warm supervisor marks the threads that run the script's code, so ``modal.is_local()`` is False in
remote code even in ``calque run --local``'s own process, as inside a Modal container.
"""

from __future__ import annotations

import threading
from typing import Any

from calque.warm.dispatch import DISPATCH, ShimError

_REMOTE = threading.local()


def mark_remote_thread() -> None:
    _REMOTE.remote = True


def in_remote_thread() -> bool:
    return bool(getattr(_REMOTE, "remote", False))


class FunctionCall:
    """``modal.FunctionCall``: ``gather`` and ``from_id`` (the calls themselves are ``calque.run``'s)."""

    @staticmethod
    def gather(*calls: Any) -> list[Any]:
        return [c.get() for c in calls]

    @staticmethod
    def from_id(call_id: str, client: Any = None) -> Any:
        if DISPATCH.client is None:
            raise ShimError("modal.FunctionCall.from_id() is not available on a calque worker")
        return DISPATCH.client.call_from_id(call_id)


def deployed(kind: str, app_name: str, name: str) -> Any:
    """``modal.Cls.from_name(app_name, name)`` / ``modal.Function.from_name``: the dispatcher's proxy."""
    if DISPATCH.client is None:  # on a worker: an inert object whose use fails its item, naming it
        return None
    return DISPATCH.client.deployed(kind, app_name, name)
