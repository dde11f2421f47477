"""The one exception root of calque and its few subclasses.

Each subclass carries the exit code the CLI root maps it to and that code's ``kind`` (the word a
script reads from ``--json`` errors); nothing else calls ``sys.exit``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic stays unimported until an error is formatted: errors.py is on every import path
    import pydantic


class CalqueError(Exception):
    """Root of every error calque raises on purpose. Exit code 1 unless a subclass says otherwise."""

    exit_code = 1
    kind = "failure"


class UsageError(CalqueError):
    """The caller asked for something invalid: bad arguments, a bad file, an unknown name."""

    exit_code = 2
    kind = "usage"


class InfrastructureError(CalqueError):
    """Something the caller does not control failed: AWS, the GPU driver, the session daemon."""

    exit_code = 3
    kind = "infrastructure"


class RefusedError(CalqueError):
    """A safety gate refused: missing consent, a spend limit, a shared-GPU warning not acknowledged."""

    exit_code = 4
    kind = "refused"


class NothingFreeError(CalqueError):
    """Everything that would do is taken right now (every matching slice is checked out): try later or wait."""

    exit_code = 5
    kind = "nothing_free"


class UnreachableError(InfrastructureError):
    """A calque service this command talks to (the session daemon) cannot be reached at all."""

    exit_code = 6
    kind = "unreachable"


class PartialFailure(CalqueError):
    """The work ran but some of it failed (e.g. some items of a run)."""

    exit_code = 1
    kind = "failure"


EXIT_CODES = {
    0: "success",
    1: "partial failure (some of the work failed) or an unexpected error",
    2: "usage error: bad arguments or input",
    3: "infrastructure error: AWS or the GPU driver failed, or the session daemon answered with an error",
    4: "refused by a safety gate (consent or spend limit) or by permissions (run it as root)",
    5: "nothing free: every matching slice is taken (retry later, or use --wait)",
    6: "cannot reach the session daemon (is calque-session.service running? is --socket right?)",
    130: "aborted (Ctrl-C)",
}


# pydantic's prefixes for errors raised in validators: the sentence after them is ours and says it all
_PREFIXES = ("Value error, ", "Assertion failed, ")


def format_validation_error(exc: pydantic.ValidationError, source: str | None = None) -> str:
    """Every problem pydantic found, as ``field.path=given: message; change field.path``, after ``source: ``.

    ``source`` names what was read (``pool spec /etc/calque/pool.yaml``); a problem with the
    document as a whole (a newer version, a wrong type) is given without a field.
    """
    problems = []
    for e in exc.errors():
        msg = str(e["msg"])
        for prefix in _PREFIXES:
            msg = msg.removeprefix(prefix)
        where = ".".join(str(x) for x in e["loc"])
        if not where:
            problems.append(msg)
        elif e.get("type") == "missing":
            problems.append(f"{where}: {msg}; set {where}")
        else:
            given = repr(e.get("input"))
            given = given if len(given) <= 80 else given[:77] + "..."
            problems.append(f"{where}={given}: {msg}; change {where}")
    text = "; ".join(problems) or str(exc)
    return f"{source}: {text}" if source else text


EXIT_KINDS = {
    0: "success",
    1: CalqueError.kind,
    2: UsageError.kind,
    3: InfrastructureError.kind,
    4: RefusedError.kind,
    5: NothingFreeError.kind,
    6: UnreachableError.kind,
    130: "aborted",
}
"""The word for each exit code, as ``--json`` errors carry it in ``error.kind``."""


def refused_for(exc: PermissionError) -> RefusedError:
    """A file or device this user may not open, as a sentence, never a traceback (exit 4, refused)."""
    where = f" on {exc.filename}" if exc.filename else ""
    return RefusedError(
        f"permission denied{where} ({exc.strerror or exc}): run it as a user who may (often root, via sudo)"
    )
