"""Values as they travel between a caller and a worker: JSON with tags for what JSON cannot carry.

Modal pickles arguments and results; calque's results live in a bucket other principals can write,
so nothing is unpickled by default. Instead a value is encoded as JSON where JSON carries it
exactly (``None``, ``bool``, ``int``, finite ``float``, ``str``, ``list``, a ``dict`` of string keys)
and as a tagged object ``{"$calque": TAG, "v": ...}`` where it does not: ``bytes``/``bytearray``
(base64), ``tuple``, ``set``/``frozenset``, ``datetime``/``date``/``time`` (ISO 8601, time zone
kept), ``timedelta``, ``Decimal``, NaN and the infinities, and a ``dict`` whose keys are not all
strings (or that has a ``$calque`` key of its own) as its list of pairs. Nesting is free.

Anything else is a ``ValueTypeError`` (a ``TypeError``) naming the type and what to do: at the call
on the caller's side, as the item's failure on a worker. Types are matched exactly, so a ``str``
subclass (an enum) or a ``float`` subclass (``numpy.float64``) is refused rather than silently
returned as its base type. Pickle stays a choice the script makes for itself: ``pickle.dumps(x)`` is
``bytes``, which travel.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
from decimal import Decimal, InvalidOperation
from typing import Any

TAG = "$calque"
# A manifest's ``encoding``: "json" (``calque pool submit``'s JSON lines, values as they are) or
# "typed" (``calque run``: this module's encoding both ways).
TYPED = "typed"
CARRIED = (
    "None, bool, int, float (NaN and infinities too), str, bytes, bytearray, list, tuple, dict (any hashable "
    "keys), set, frozenset, datetime, date, time, timedelta and Decimal, nested freely"
)


class ValueTypeError(TypeError):
    """A value calque cannot carry between a caller and a pool (the message says what to do)."""


def type_name(t: type) -> str:
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _refuse(value: Any, where: str) -> ValueTypeError:
    name = type_name(type(value))
    return ValueTypeError(
        f"{where}: a value of type {name} cannot travel between the caller and the pool; calque carries {CARRIED}. "
        f"Convert it (x.tolist(), str(x), float(x), a dict of its fields), or pickle it yourself "
        f"(pickle.dumps(x) is bytes; unpickle only what you trust: results live in a bucket others may write)"
    )


def _tagged(tag: str, v: Any) -> dict[str, Any]:
    return {TAG: tag, "v": v}


def encode(value: Any, where: str = "value") -> Any:
    """``value`` as JSON-ready data (lists, dicts, str, numbers); ``ValueTypeError`` if it cannot travel."""
    try:
        return _encode(value, where)
    except RecursionError:
        raise ValueTypeError(f"{where}: the value is nested too deeply, or contains itself") from None


def _encode(value: Any, where: str) -> Any:
    t = type(value)
    if value is None or t is bool or t is str or t is int:
        return value
    if t is float:
        return value if math.isfinite(value) else _tagged("float", repr(value))
    if t is list:
        return [_encode(v, where) for v in value]
    if t is dict:
        if TAG not in value and all(type(k) is str for k in value):
            return {k: _encode(v, where) for k, v in value.items()}
        return _tagged("dict", [[_encode(k, where), _encode(v, where)] for k, v in value.items()])
    if t is tuple:
        return _tagged("tuple", [_encode(v, where) for v in value])
    if t is set or t is frozenset:
        return _tagged(t.__name__, [_encode(v, where) for v in value])
    if t is bytes or t is bytearray:
        return _tagged(t.__name__, base64.b64encode(value).decode("ascii"))
    if t is dt.datetime or t is dt.date or t is dt.time:
        return _tagged(t.__name__, value.isoformat())
    if t is dt.timedelta:
        return _tagged("timedelta", [value.days, value.seconds, value.microseconds])
    if t is Decimal:
        return _tagged("decimal", str(value))
    raise _refuse(value, where)


_SCALARS: dict[str, Any] = {
    "float": float,
    "bytes": lambda v: base64.b64decode(v, validate=True),
    "bytearray": lambda v: bytearray(base64.b64decode(v, validate=True)),
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "timedelta": lambda v: dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "decimal": Decimal,
}


def decode(data: Any, where: str = "value") -> Any:
    """The value ``encode`` made ``data`` from; ``ValueTypeError`` for a tag it does not know."""
    t = type(data)
    if t is list:
        return [decode(v, where) for v in data]
    if t is not dict:
        return data
    tag = data.get(TAG)
    if tag is None:
        return {k: decode(v, where) for k, v in data.items()}
    v = data.get("v")
    try:
        if tag in _SCALARS:
            return _SCALARS[tag](v)
        if tag == "tuple":
            return tuple(decode(x, where) for x in v)
        if tag == "set":
            return {decode(x, where) for x in v}
        if tag == "frozenset":
            return frozenset(decode(x, where) for x in v)
        if tag == "dict":
            return {decode(k, where): decode(x, where) for k, x in v}
    except (TypeError, ValueError, IndexError, InvalidOperation) as exc:
        raise ValueTypeError(f"{where}: a {tag} value that cannot be read back ({exc})") from None
    raise ValueTypeError(f"{where}: an encoded value of unknown kind {tag!r}: upgrade calque where it is read")
