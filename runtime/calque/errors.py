"""The one exception root of calque and its few subclasses.

Each subclass carries the exit code the CLI root maps it to; nothing else calls ``sys.exit``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic is imported only by callers that validate
    from pydantic import ValidationError


class CalqueError(Exception):
    """Root of every error calque raises on purpose. Exit code 1 unless a subclass says otherwise."""

    exit_code = 1


class UsageError(CalqueError):
    """The caller asked for something invalid: bad arguments, a bad file, an unknown name."""

    exit_code = 2


class InfrastructureError(CalqueError):
    """Something the caller does not control failed: AWS, the GPU driver, the session daemon."""

    exit_code = 3


class RefusedError(CalqueError):
    """A safety gate refused: missing consent, a spend limit, a shared-GPU warning not acknowledged."""

    exit_code = 4


class PartialFailure(CalqueError):
    """The work ran but some of it failed (e.g. some items of a run)."""

    exit_code = 1


EXIT_CODES = {
    0: "success",
    1: "partial failure (some of the work failed) or an unexpected error",
    2: "usage error: bad arguments or input",
    3: "infrastructure error: AWS, the GPU driver or the session daemon",
    4: "refused by a safety gate (consent or spend limit)",
}


def format_validation_error(exc: ValidationError, source: str | None = None) -> str:
    """Every problem pydantic found as one sentence each, naming the field, the value given and what to change.

    ``source`` names what was validated (a file, a module's options) and leads the message.
    """
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        if not loc:
            parts.append(msg)
        elif err.get("type") == "missing":
            parts.append(f"{loc} is required; set {loc}")
        else:
            given = repr(err.get("input"))
            given = given if len(given) <= 80 else given[:77] + "..."
            parts.append(f"{loc}={given}: {msg}; change {loc}")
    text = "; ".join(parts)
    return f"{source}: {text}" if source else text
