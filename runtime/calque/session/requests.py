"""One typed request per operation: what each op of the session socket accepts, and nothing else.

Unknown keys are refused by name (a misspelled ``"tll"`` is an error, not the default TTL), consent
is a real JSON ``true``, numbers are finite and in range, strings are bounded, and no value nests:
every argument is a scalar. Errors name the field (``calque.errors.format_validation_error``).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import Field, PlainValidator, StrictBool, StrictInt, StrictStr, ValidationError

from calque.errors import format_validation_error
from calque.models.base import CalqueModel
from calque.session.protocol import RequestError

MAX_SECONDS = 10 * 365 * 86400


def _duration(v: object) -> str | float:
    # One message for both shapes (a union would report each branch's failure separately).
    if isinstance(v, str) and len(v) <= 32:
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= MAX_SECONDS:
        return float(v)
    raise ValueError("must be a duration such as 30m or 2h, or a finite number of seconds (at most 10 years)")


# Whether it is long enough (positive, within limits) is checked where the meaning is known.
Duration = Annotated[str | float, PlainValidator(_duration)]
SessionId = Annotated[StrictStr, Field(min_length=1, max_length=64)]


class RequestArgs(CalqueModel):
    """Arguments of an operation that takes none."""


class CheckoutArgs(RequestArgs):
    profile: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None
    mps: StrictBool = False
    gpu: Annotated[StrictInt, Field(ge=0, le=1023)] | None = None
    ttl: Duration | None = None
    consent: StrictBool = Field(False, description="MPS only: the caller accepts a GPU shared with no isolation")
    request_id: Annotated[StrictStr, Field(max_length=128)] | None = None


class SessionRefArgs(RequestArgs):
    """An operation on one of the caller's sessions (the only one when ``id`` is omitted)."""

    id: SessionId | None = None


class ExtendArgs(SessionRefArgs):
    by: Duration


class ReleaseArgs(RequestArgs):
    id: SessionId
    force: StrictBool = False
    reason: Annotated[StrictStr, Field(max_length=500)] | None = None


class ReportArgs(RequestArgs):
    since: Duration = "7d"


REQUESTS: dict[str, type[RequestArgs]] = {
    "checkout": CheckoutArgs,
    "checkin": SessionRefArgs,
    "adopt": SessionRefArgs,
    "extend": ExtendArgs,
    "status": RequestArgs,
    "list": RequestArgs,
    "release": ReleaseArgs,
    "report": ReportArgs,
    "ping": RequestArgs,
    "whoami": RequestArgs,
    "metrics": RequestArgs,
}


def parse_args(op: str, args: dict[str, Any]) -> RequestArgs:
    """The typed arguments of ``op``; RequestError("usage") naming each bad field otherwise."""
    model = REQUESTS.get(op)
    if model is None:
        raise RequestError("usage", f"unknown operation {op!r}; this daemon serves {', '.join(sorted(REQUESTS))}")
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        raise RequestError("usage", format_validation_error(exc, f"bad arguments to {op}")) from exc
