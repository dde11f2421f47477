"""Shares and sizes as people write them: ``5%`` or ``0.05``, ``2GiB`` or ``512MiB``.

A share is a fraction from 0 to 1 (``0.05``) or a percentage with its sign (``5%``); a bare ``5`` is
refused, since it could mean either. A size takes ``KiB``/``MiB``/``GiB``/``TiB`` (or ``K``/``M``/
``G``/``T``, the same binary units) and a bare number is MiB. Percent (the ``Percent`` field) is the
stored form of a share; Mebibytes (the ``Mebibytes`` field) of a size.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

from calque.errors import UsageError

_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(KiB|MiB|GiB|TiB|K|M|G|T)?B?\s*", re.IGNORECASE)
_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


class QuantityError(UsageError, ValueError):
    """A share or size that cannot be read (a ``ValueError`` too, for pydantic fields)."""


def parse_percent(value: str | int | float, *, what: str = "a share") -> float:
    """Percent (0 to 100) from ``5%`` or a fraction ``0.05``; ``QuantityError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise QuantityError(f"{what} must be a fraction such as 0.05 or a percentage such as 5%")
    text = str(value).strip()
    try:
        pct = float(text[:-1]) if text.endswith("%") else float(text) * 100
    except ValueError:
        raise QuantityError(f"{what} {value!r} is not a share: write e.g. 5% or 0.05") from None
    if not text.endswith("%") and float(text) > 1:
        raise QuantityError(f"{what} {value!r} is ambiguous: write {text}% for a percentage, or a fraction up to 1")
    if not math.isfinite(pct) or not 0 <= pct <= 100:
        raise QuantityError(f"{what} {value!r} must be between 0% and 100%")
    return pct


def parse_mib(value: str | int, *, what: str = "a size") -> int:
    """Whole MiB from ``2GiB``, ``512MiB``, ``1.5G`` or a bare number of MiB."""
    m = _SIZE.fullmatch(str(value)) if not isinstance(value, bool) else None
    if m is None:
        raise QuantityError(f"{what} {value!r} is not a size: write e.g. 2GiB, 512MiB or 1.5G")
    return round(float(m.group(1)) * _MIB[(m.group(2) or "M")[0].lower()])


def _percent_field(value: Any) -> Any:
    return parse_percent(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else value


Percent = Annotated[float, BeforeValidator(_percent_field), PlainSerializer(lambda v: f"{v:g}%", return_type=str)]
"""A model field stored in percent that takes ``5%`` or ``0.05`` and is written back as ``5%``."""


def _mib_field(value: Any) -> Any:
    if isinstance(value, str):
        return parse_mib(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        raise QuantityError(f"a size {value!r} cannot be negative")
    return value


Mebibytes = Annotated[int, BeforeValidator(_mib_field), PlainSerializer(lambda v: f"{v}MiB", return_type=str)]
"""A model field stored in whole MiB that takes ``2GiB``, ``512MiB`` or a bare number of MiB."""
