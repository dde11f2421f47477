"""The base every calque model derives from: strict about unknown fields, friendly to JSON.

Anything that crosses a process or network boundary (queue messages, S3 objects, socket frames,
files people write) derives from ``VersionedModel``. The rule for reading versions:

- A model's ``version`` default is the version this calque *writes*; it reads every version from
  ``oldest_version`` up to that one (an older document is read as its version meant it).
- A newer version is refused before any other field is looked at, with an error naming both
  versions and what to upgrade (``upgrade_hint``). Guessing at a newer document's meaning is how
  a version-2 claim used to run as if it were version 1.
- Versions start at 1; 0 and negatives are refused.

Bump a model's version only for a change an older reader would misread; teach the reader the old
shape in a ``mode="before"`` validator when you do. docs/pool.md says what each side of the pool
does when it meets a newer document.
"""

from __future__ import annotations

import ipaddress
import math
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, PlainValidator, model_validator

from calque.durations import parse_duration, parse_seconds
from calque.models.pool_names import check_pool_name
from calque.models.versions import check_version_number


class CalqueModel(BaseModel):
    """Forbid unknown fields so a typo in a spec or a message from a newer version fails loudly."""

    # defer_build: a model builds its validator on first use, so a command pays only for the models it
    # touches (`calque pool status` imports models/pool.py and uses three of its classes)
    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True, defer_build=True)


class VersionedModel(CalqueModel):
    """A model that crosses a boundary: its ``version`` is checked first, by the rule above."""

    version: int = 1
    oldest_version: ClassVar[int] = 1
    version_label: ClassVar[str] = ""  # what the error calls the document; default: the class name
    upgrade_hint: ClassVar[str] = "upgrade calque where this document is read"

    @model_validator(mode="before")
    @classmethod
    def _known_version(cls, data: Any) -> Any:
        if isinstance(data, dict) and "version" in data:
            check_version(cls, data["version"])
        return data


def current_version(model: type[VersionedModel]) -> int:
    """The version ``model`` writes (its ``version`` default), hence the newest it reads."""
    default = model.model_fields["version"].default
    assert isinstance(default, int)
    return default


def check_version(model: type[VersionedModel], version: Any) -> None:
    """ValueError unless ``version`` is one ``model`` reads; non-integers are left to the field's own check."""
    label = model.version_label or model.__name__
    check_version_number(label, version, current_version(model), model.upgrade_hint, model.oldest_version)


def _ip_address(v: str) -> str:
    try:
        return str(ipaddress.ip_address(v))
    except ValueError:
        raise ValueError(f"{v!r} is not an IP address: use 127.0.0.1, 0.0.0.0 or a host's IP") from None


PoolName = Annotated[str, AfterValidator(check_pool_name)]
"""A pool's identity, e.g. ``lab-a/embedder``; validated wherever a model carries it (the names it
derives are ``calque.models.pool_names``, which imports no pydantic: ``calque pool status`` reads them)."""

# The address a metrics port binds: an IP literal, never a name a resolver could answer differently.
BindAddress = Annotated[str, AfterValidator(_ip_address)]


def _seconds_field(value: Any) -> Any:
    # None and non-scalars fall through to the field's own type check and its message
    return parse_duration(value) if isinstance(value, (str, int, float)) else value


def _whole_seconds_field(value: Any) -> Any:
    return parse_seconds(value) if isinstance(value, (str, int, float)) else value


Seconds = Annotated[float, BeforeValidator(_seconds_field)]
"""A model field in seconds that also takes the duration grammar (``idle_timeout_s: 10m``)."""
WholeSeconds = Annotated[int, BeforeValidator(_whole_seconds_field)]
"""As ``Seconds``, rounded to whole seconds (SQS and EC2 settings)."""


MAX_SECONDS = 10 * 365 * 86400


def _duration(v: object) -> str | float:
    # One message for both shapes (a union would report each branch's failure separately). An int is
    # compared as an int: a 401-digit one cannot become a float (OverflowError is no ValueError).
    if isinstance(v, str) and len(v) <= 32:
        return v
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SECONDS:
        return float(v)
    if isinstance(v, float) and math.isfinite(v) and 0 <= v <= MAX_SECONDS:
        return v
    raise ValueError("must be a duration such as 30m or 2h, or a finite number of seconds (at most 10 years)")


# Whether it is long enough (positive, within limits) is checked where the meaning is known.
Duration = Annotated[str | float, PlainValidator(_duration)]


def positive_seconds(value: str | float, flag: str) -> float:
    """``value`` in seconds; ValueError (a ``usage`` error) unless it parses and is positive."""
    seconds = parse_duration(value, what=flag)  # DurationError is a ValueError
    if seconds <= 0:
        raise ValueError(f"{flag} must be positive, e.g. 30m or 2h")
    return seconds
