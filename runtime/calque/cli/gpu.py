"""``calque gpu ...``: the GPU catalog, facts, MIG layouts and MPS daemons on this host."""

from __future__ import annotations

import click

from calque.cli.options import json_option
from calque.cli.output import emit, table
from calque.gpu.catalog import Catalog, load_catalog


@click.group()
def gpu() -> None:
    """Inspect GPUs, lay out MIG slices and run MPS daemons on this host."""


def _render_catalog(cat: Catalog) -> str:
    parts = [
        table(
            ["family", "card", "sharing", "GPUs per size"],
            [
                [
                    f + (" ?" if fam.uncertain else ""),
                    fam.card,
                    fam.sharing,
                    " ".join(f"{s}:{n}" for s, n in fam.sizes.items()),
                ]
                for f, fam in cat.ec2_families.items()
            ],
        )
    ]
    for key, card in cat.cards.items():
        head = f"\n{key} ({card.nvml_names[0]}, {card.memory_mib} MiB, " + (
            f"MIG: max {card.max_instances} instances on a {card.placement_units}-slice grid)"
            if card.mig
            else "no MIG)"
        )
        parts.append(head)
        if card.profiles:
            parts.append(
                table(
                    ["profile", "id", "g", "slices", "max", "starts", "SMs", "uncertain"],
                    [
                        [
                            p.name,
                            p.profile_id,
                            p.compute_slices,
                            p.memory_slices,
                            p.max_count,
                            ",".join(map(str, p.placements.starts)),
                            p.sms,
                            ",".join(p.uncertain),
                        ]
                        for p in card.profiles
                    ],
                )
            )
    return "\n".join(parts)


@gpu.command()
@click.option("--card", default=None, help="Show only this card (catalog key or NVML name).")
@json_option
def catalog(card: str | None, as_json: bool) -> None:
    """Show the GPU catalog: cards, MIG profiles and EC2 families (`?` marks inferred values)."""
    cat = load_catalog()
    if card is not None:
        c = cat.card(card)
        cat = cat.model_copy(
            update={
                "cards": {c.key: c},
                "ec2_families": {f: fam for f, fam in cat.ec2_families.items() if fam.card == c.key},
            }
        )
    emit(cat, as_json, _render_catalog)
