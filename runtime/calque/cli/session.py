"""``calque session ...``: check a MIG slice or MPS slot out and in, as yourself."""

from __future__ import annotations

import click


@click.group()
def session() -> None:
    """Check a GPU slice out for a bounded time, use it, and check it in."""
