"""Reading JSON into frozen dataclasses without pydantic: the readers behind the pydantic-free views.

A few commands print what a daemon or a bucket says, and pydantic's import plus the models' build is
most of their start-up (``calque session status``/``list``, ``calque pool status``; bench/cli_startup.py,
bench/pool_status.py). Their human output reads the same documents into dataclass twins of the models
(``calque.session.client.views``, ``calque.models.pool_views``), field by field by each field's
annotation, at least as strictly as the model: an unknown field, a missing one without a default, a
value of the wrong type is refused; so is a string of digits for an integer, which a model's lax
mode would read. Each twin is held to its model by a test, so the two cannot drift. Everything else
(``--json``, every write) uses the models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar


class ViewError(ValueError):
    """A document a view cannot read: the first problem, with the field's name in front."""


def read_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise ViewError("not a string")


def read_int(v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    raise ViewError("not an integer")


def read_float(v: Any) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise ViewError("not a number")


def read_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    raise ViewError("not true or false")


def read_time(v: Any) -> datetime:
    try:
        text = read_str(v)  # Python 3.10's fromisoformat does not read the "Z" pydantic writes
        return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise ViewError("not an ISO 8601 time") from None


def read_str_map(v: Any) -> dict[str, str]:
    if isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        return dict(v)
    raise ViewError("not an object of strings")


def read_strs(v: Any) -> list[str]:
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    raise ViewError("not a list of strings")


READERS: Mapping[str, Callable[[Any], Any]] = {
    "str": read_str,
    "int": read_int,
    "float": read_float,
    "bool": read_bool,
    "datetime": read_time,
    "dict[str, str]": read_str_map,
    "list[str]": read_strs,
}
"""Each field annotation (as a string: the views use ``from __future__ import annotations``) and its reader."""

V = TypeVar("V")


def read_view(cls: type[V], data: Any, readers: Mapping[str, Callable[[Any], Any]] = READERS) -> V:
    """``cls`` from one JSON object, field by field by its annotations; ``X | None`` takes null too.

    ``readers`` is ``READERS`` plus the view's own (a nested view, a ``Literal``); a field whose
    annotation has no reader is a programming error (KeyError), found by the view's test."""
    if not isinstance(data, dict):
        raise ViewError(f"a {cls.__name__.removesuffix('View')} is not a JSON object")
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    extra = sorted(set(data) - set(known))
    if extra:
        raise ViewError(f"unknown field(s) {', '.join(extra)}")
    values: dict[str, Any] = {}
    for name, f in known.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ViewError(f"{name}: missing")
            continue
        annotation = str(f.type)
        optional = annotation.endswith(" | None")
        raw = data[name]
        try:
            values[name] = None if optional and raw is None else readers[annotation.removesuffix(" | None")](raw)
        except ViewError as exc:
            raise ViewError(f"{name}: {exc}") from None
    return cls(**values)
