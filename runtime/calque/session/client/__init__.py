"""The researcher's side of the session socket: what ``calque session ...`` imports.

``SessionClient`` (``connection.py``) talks to the daemon, one request per connection, and checks
who answers (SO_PEERCRED) before anything is sent or believed; its methods take each operation's
typed arguments and return typed answers (``calque.models.session``). For another component acting
as root (an admin's tooling, a layout change): ``SessionClient().list_slices()`` lists every slice with its
holder, ``SessionClient().release(session_id, reason="...")`` ends a session with a reason for the
audit trail. ``verbs.py`` is what the CLI's verbs call, ``shellenv.py`` what ``--shell`` prints.

The names below load on first use (PEP 562), so ``calque session --help`` imports no pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from calque.session.client.connection import NoFreeSliceError, SessionClient, default_socket

__all__ = ["NoFreeSliceError", "SessionClient", "default_socket"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("calque.session.client.connection"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
