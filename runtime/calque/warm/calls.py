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
        from calque.warm import modal_shim  # the shim imports this module

        if modal_shim._CLIENT is None:
            raise modal_shim.ShimError("modal.FunctionCall.from_id() is not available on a calque worker")
        return modal_shim._CLIENT.call_from_id(call_id)


def deployed(kind: str, app_name: str, name: str) -> Any:
    """``modal.Cls.from_name(app_name, name)`` / ``modal.Function.from_name``: the dispatcher's proxy."""
    from calque.warm import modal_shim  # the shim imports this module

    if modal_shim._CLIENT is None:  # on a worker: an inert object whose use fails its item, naming it
        return None
    return modal_shim._CLIENT.deployed(kind, app_name, name)
