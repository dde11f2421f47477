"""The two prices of a GPU-second: at EC2 rates (``data/ec2-rates.yaml``, the spend gate's one table)
and at Modal's published per-second price (``data/modal-gpu-prices.yaml``, dated and cited).

A session host's GPU is priced at the cheapest per-GPU on-demand rate of an EC2 type carrying the
same card (a p4d.24xlarge's $21.96/h over 8 GPUs for an A100-40GB): what the same GPU would cost
rented, whether the host is on EC2 or not. A pool instance is priced at its own type's rate.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from calque.aws.pricing import rates_table
from calque.errors import UsageError
from calque.gpu.catalog import load_catalog

MODAL_FILE = "modal-gpu-prices.yaml"


@dataclass(frozen=True)
class ModalClass:
    name: str
    usd_per_second: float
    source: str
    uncertain: str | None


@dataclass(frozen=True)
class ModalTable:
    read_on: str
    classes: dict[str, ModalClass]
    by_card: dict[str, ModalClass]


@functools.lru_cache(maxsize=1)
def modal_table() -> ModalTable:
    text = resources.files("calque").joinpath("data").joinpath(MODAL_FILE).read_text(encoding="utf-8")
    doc: dict[str, Any] = yaml.safe_load(text)
    if doc.get("version") != 1:
        raise UsageError(f"{MODAL_FILE} has version {doc.get('version')!r}; this runtime reads 1")
    sources: dict[str, str] = doc.get("sources") or {}
    classes: dict[str, ModalClass] = {}
    by_card: dict[str, ModalClass] = {}
    for name, row in (doc.get("classes") or {}).items():
        c = ModalClass(
            name=str(name),
            usd_per_second=float(row["usd_per_second"]),
            source=sources.get(str(row["source"]), str(row["source"])),
            uncertain=row.get("uncertain"),
        )
        classes[c.name] = c
        for card in row.get("cards") or []:
            by_card[str(card).lower()] = c
    return ModalTable(read_on=str(doc["read_on"]), classes=classes, by_card=by_card)


def modal_usd_per_gpu_second(card: str | None) -> float | None:
    """Modal's price of one GPU-second of ``card`` (a catalog key or a rates-table GPU name); None: no class."""
    if card is None:
        return None
    c = modal_table().by_card.get(card.lower())
    return None if c is None else c.usd_per_second


def _rates_gpu_name(card: str) -> str | None:
    """The rates table's name of a catalog card (its EC2 families' types carry it), or ``card`` itself."""
    cat = load_catalog()
    families = [f for f, fam in cat.ec2_families.items() if fam.card.lower() == card.lower()]
    for t, row in rates_table().types.items():
        if t.split(".", 1)[0] in families:
            return row.gpu
    return card if any(r.gpu.lower() == card.lower() for r in rates_table().types.values()) else None


@functools.lru_cache(maxsize=64)
def ec2_usd_per_gpu_hour(card: str | None) -> float | None:
    """The cheapest on-demand $/GPU-hour of an EC2 type carrying ``card``; None when no type does."""
    if card is None:
        return None
    name = _rates_gpu_name(card)
    if name is None:
        return None
    per_gpu = [r.usd_per_hour / r.gpus for r in rates_table().types.values() if r.gpu == name and r.gpus]
    return min(per_gpu) if per_gpu else None


def instance_card(instance_type: str) -> tuple[str | None, int]:
    """The GPU name and count of an EC2 type, from the rates table (the pool's view of an instance)."""
    row = rates_table().types.get(instance_type)
    if row is None:
        return None, 1
    return row.gpu, max(1, row.gpus)


def instance_usd_per_hour(instance_type: str, spot_usd_per_hour: float | None = None) -> float | None:
    """What an instance of ``instance_type`` costs an hour: the spot price paid where known, else on-demand."""
    if spot_usd_per_hour is not None:
        return spot_usd_per_hour
    row = rates_table().types.get(instance_type)
    return None if row is None else row.usd_per_hour
