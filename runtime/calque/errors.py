"""The one exception root of calque and its few subclasses.

Each subclass carries the exit code the CLI root maps it to and that code's ``kind`` (the word a
script reads from ``--json`` errors); nothing else calls ``sys.exit``.
"""

from __future__ import annotations


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
    4: "refused by a safety gate (consent or spend limit)",
    5: "nothing free: every matching slice is taken (retry later, or use --wait)",
    6: "cannot reach the session daemon (is calque-session.service running? is --socket right?)",
    130: "aborted (Ctrl-C)",
}

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
