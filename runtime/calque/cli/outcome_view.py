"""Printing an operation's Outcome: ``--json`` is ``Outcome.model_dump_json()``, the human view renders it.

Warnings go to stderr in both views; a failure is raised after printing, so the CLI root turns it
into the failure's exit code (the same ``calque_exit_code`` a module reports). A check-mode outcome
with a failure is a plan the real run would refuse: its verdict says so, never "no change needed".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from calque.cli.output import emit, warn
from calque.ops.outcome import Outcome


def render_outcome(outcome: Outcome[Any], detail: Callable[[Outcome[Any]], str] | None = None) -> str:
    """Actions (planned, in check mode), the resource's own detail, what is pending, and the verdict."""
    refused = outcome.check_mode and outcome.failure is not None  # a plan the real run would refuse
    if outcome.check_mode and outcome.actions:
        lines = ["plan (check mode, nothing changed):", *(f"  {a}" for a in outcome.actions)]
    else:
        lines = list(outcome.actions) or ([] if refused else ["nothing to do"])
    extra = detail(outcome) if detail else ""
    if extra:
        lines += ["", extra] if lines else [extra]
    if outcome.pending:
        lines.append(f"pending: a {outcome.pending} (calque does not do it on its own)")
    if refused:
        lines.append("refused: the real run would change nothing (the reason follows)")
    elif outcome.check_mode:
        lines.append("would change" if outcome.changed else "no change needed")
    else:
        lines.append("changed" if outcome.changed else "no change")
    return "\n".join(lines)


def emit_outcome(outcome: Outcome[Any], as_json: bool, detail: Callable[[Outcome[Any]], str] | None = None) -> None:
    emit(outcome, as_json, lambda o: render_outcome(o, detail))
    for message in outcome.warnings:
        warn(message)
    outcome.raise_for_failure()
