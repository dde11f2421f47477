"""Each request's arguments, typed by the contracts in ``calque.models.session`` (defined there once,
for the client and the daemon alike); errors name the field (``calque.errors.format_validation_error``)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from calque.errors import format_validation_error
from calque.models.session import REQUESTS, RequestArgs, error_kind
from calque.session.daemon.wire import RequestError


def parse_args(op: str, args: dict[str, Any]) -> RequestArgs:
    """The typed arguments of ``op``; RequestError("usage") naming each bad field otherwise (a
    refusing rule, such as MPS without consent, is ``refused``)."""
    model = REQUESTS.get(op)
    if model is None:
        raise RequestError("usage", f"unknown operation {op!r}; this daemon serves {', '.join(sorted(REQUESTS))}")
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        raise RequestError(error_kind(exc), format_validation_error(exc, f"bad arguments to {op}")) from exc
