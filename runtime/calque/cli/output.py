"""Printing results: ``--json`` dumps the model; the human view is a rendering of the same model."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

M = TypeVar("M")


def emit(data: M, as_json: bool, render: Callable[[M], str]) -> None:
    """Print ``data`` as JSON or through ``render``; both come from the same object."""
    if as_json:
        click.echo(to_json(data))
    else:
        click.echo(render(data))


def to_json(data: Any) -> str:
    from pydantic import BaseModel  # only when printing JSON: the human path never needs it

    if isinstance(data, BaseModel):
        return data.model_dump_json(indent=2)
    if isinstance(data, (list, tuple)) and all(isinstance(d, BaseModel) for d in data):
        return json.dumps([d.model_dump(mode="json") for d in data], indent=2)
    return json.dumps(data, indent=2, default=str)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table (no colours: it is read in terminals, logs and journals alike)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def progress_enabled() -> bool:
    return sys.stderr.isatty()


def progress_to_stderr(message: str) -> None:
    """A step of a long operation, on stderr so that stdout stays the result (and --json stays JSON)."""
    click.echo(message, err=True)
