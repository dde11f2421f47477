"""``calque gpu ...``: the GPU catalog, facts, MIG layouts and MPS daemons on this host."""

from __future__ import annotations

import click


@click.group()
def gpu() -> None:
    """Inspect GPUs, lay out MIG slices and run MPS daemons on this host."""
