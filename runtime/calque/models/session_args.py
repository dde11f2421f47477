"""The base of every session request's arguments, and the session reference most of them take (kept
apart from ``models/session.py`` so that an operation's arguments may live in a module of their own,
as ``models/notebook.py``'s do, without a circle)."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, StrictStr

from calque.models.base import CalqueModel

_DEFERRED = ConfigDict(defer_build=True)

SessionId = Annotated[StrictStr, Field(min_length=1, max_length=64)]


class RequestArgs(CalqueModel):
    """Arguments of an operation that takes none."""

    model_config = _DEFERRED


class SessionRefArgs(RequestArgs):
    """An operation on one of the caller's sessions (the only one when ``id`` is omitted)."""

    model_config = _DEFERRED

    id: SessionId | None = None
