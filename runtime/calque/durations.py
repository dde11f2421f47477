"""Durations as people write them: one grammar for every flag, config file, spec and module option.

Accepted: plain seconds (``90``, ``90s``, ``2.5``), units ``d``/``h``/``m``/``s`` combined largest
first with or without spaces (``1h30m``, ``1h 30m``, ``2d 4h``), and decimals (``1.5h``). Refused,
with a sentence that gives examples: anything else, negatives, NaN and infinity. ``format_duration``
writes what ``parse_duration`` reads, so a value shown to a person can be pasted back.
"""

from __future__ import annotations

import math
import re

from calque.errors import UsageError

UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
EXAMPLES = "90, 90s, 30m, 1.5h, 1h30m, '1h 30m' or 2d"
_TOKEN = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([dhms])\s*", re.IGNORECASE)
_PLAIN = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*")


class DurationError(UsageError, ValueError):
    """A duration that cannot be read. A ``ValueError`` too, so pydantic validators report it per field."""


def parse_duration(value: str | int | float, *, what: str = "") -> float:
    """Seconds from a number of seconds or a string in the grammar above; ``DurationError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DurationError(f"{what or 'a duration'} must be a number of seconds or a string such as {EXAMPLES}")
    if isinstance(value, (int, float)):
        return _checked(float(value), value, what)
    plain = _PLAIN.fullmatch(value)
    if plain:
        return _checked(float(plain.group(1)), value, what)
    total, pos, seen = 0.0, 0, ""
    for m in _TOKEN.finditer(value):
        unit = m.group(2).lower()
        # units largest first, each once: "30m1h" or "1h1h" is more likely a typo than a sum
        if m.start() != pos or (seen and "dhms".index(unit) <= "dhms".index(seen[-1])):
            break
        total += float(m.group(1)) * UNITS[unit]
        pos, seen = m.end(), seen + unit
    if not seen or pos != len(value):
        sign = " (durations cannot be negative)" if value.strip().startswith("-") else ""
        raise DurationError(f"{_named(what, value)} is not a duration{sign}: write e.g. {EXAMPLES}")
    return _checked(total, value, what)


def parse_seconds(value: str | int | float, *, what: str = "") -> int:
    """``parse_duration`` rounded to whole seconds, for settings AWS takes as integers."""
    return round(parse_duration(value, what=what))


def _checked(seconds: float, raw: object, what: str) -> float:
    if math.isnan(seconds) or math.isinf(seconds):
        raise DurationError(f"{_named(what, raw)} is not a finite duration: write e.g. {EXAMPLES}")
    if seconds < 0:
        raise DurationError(f"{_named(what, raw)} is negative: write a positive duration such as {EXAMPLES}")
    return seconds


def _named(what: str, raw: object) -> str:
    return f"{what} {raw!r}" if what else repr(raw)


def format_duration(seconds: float) -> str:
    """``5400`` -> ``1h30m``, ``90061.5`` -> ``1d1h1m1.5s``, ``0`` -> ``0s``: what ``parse_duration`` reads."""
    micros = round(_checked(float(seconds), seconds, "") * 1_000_000)  # microseconds are plenty
    whole, frac = divmod(micros, 1_000_000)
    parts: list[str] = []
    for unit, size in UNITS.items():
        n, whole = divmod(whole, size)
        text = str(n) if unit != "s" or not frac else f"{n}.{frac:06d}".rstrip("0")
        if text != "0":
            parts.append(f"{text}{unit}")
    return "".join(parts) or "0s"
