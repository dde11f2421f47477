"""``calque gpu ...``: the GPU catalog, facts, MIG layouts and MPS daemons on this host."""

from __future__ import annotations

import click

from calque.cli.options import json_option
from calque.cli.output import emit, table
from calque.errors import PartialFailure
from calque.gpu.catalog import Catalog, load_catalog
from calque.gpu.nvml import NvmlBackend
from calque.gpu.verify import VerifyReport
from calque.gpu.verify import verify as verify_host


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


def _render_verify(r: VerifyReport) -> str:
    lines = [f"driver {r.driver_version}"]
    for g in r.gpus:
        mig = "MIG on" if g.mig_current else "MIG off"
        lines.append(
            f"GPU {g.index}: {g.name} ({g.card or 'not in catalog'}, {g.memory_mib} MiB, {mig}, "
            f"{g.profiles_checked} profiles compared)"
        )
        lines += [f"  note: {n}" for n in g.notes]
    if r.differences:
        lines.append("")
        lines.append(
            table(
                ["gpu", "card", "profile", "field", "catalog", "driver", "catalog marked uncertain"],
                [
                    [d.gpu_index, d.card, d.profile or "-", d.field, d.catalog, d.driver, "yes" if d.uncertain else ""]
                    for d in r.differences
                ],
            )
        )
    lines.append("")
    lines.append(
        f"{len(r.differences)} difference(s) between the catalog and the cards"
        if r.differences
        else "the catalog matches every card"
    )
    return "\n".join(lines)


@gpu.command()
@click.option("--strict", is_flag=True, help="Exit 1 when any difference is found.")
@json_option
def verify(strict: bool, as_json: bool) -> None:
    """Compare the catalog with what NVML reports on this host's cards (read-only).

    Needs the NVIDIA driver; exits 3 when there is none. Only reads: names, memory, MIG mode,
    GPU-instance profiles and their possible placements (profiles only while MIG mode is on).
    """
    with NvmlBackend() as backend:
        report = verify_host(backend)
    emit(report, as_json, _render_verify)
    if strict and report.differences:
        raise PartialFailure(f"{len(report.differences)} difference(s) between the catalog and the cards")
