"""EC2 on-demand rates and instance shapes, from the package data file ``data/ec2-rates.yaml``.

The spend gate and the warm-pool cost model both read prices here, so there is one table. Rates are
us-east-1 Linux on-demand list prices for planning; rows marked ``uncertain`` say why. A spot cohort
is gated at the on-demand rate (the most a spot instance can cost).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

from calque.errors import UsageError
from calque.models.acquire import InstanceRate, RatesTable

RATES_FILE = "ec2-rates.yaml"


@functools.lru_cache(maxsize=1)
def rates_table() -> RatesTable:
    """The parsed rates table (read once per process)."""
    text = resources.files("calque").joinpath("data").joinpath(RATES_FILE).read_text(encoding="utf-8")
    doc: dict[str, Any] = yaml.safe_load(text)
    sources: dict[str, str] = doc.get("sources") or {}
    types = {
        name: InstanceRate(
            instance_type=name,
            usd_per_hour=float(row["usd_per_hour"]),
            vcpus=int(row["vcpus"]),
            gpus=int(row["gpus"]),
            gpu=str(row["gpu"]),
            source=sources.get(str(row["source"]), str(row["source"])),
            as_of=str(row["as_of"]),
            uncertain=row.get("uncertain"),
        )
        for name, row in (doc.get("types") or {}).items()
    }
    return RatesTable(
        version=int(doc.get("version", 1)),
        region=str(doc["region"]),
        currency=str(doc.get("currency", "USD")),
        sources=sources,
        types=types,
    )


def known_types() -> list[str]:
    """Every instance type the table prices, sorted."""
    return sorted(rates_table().types)


def rate(instance_type: str) -> InstanceRate:
    """The table row for ``instance_type``; UsageError naming the known types when there is none."""
    row = rates_table().types.get(instance_type)
    if row is None:
        family = instance_type.split(".", 1)[0]
        same_family = [t for t in known_types() if t.split(".", 1)[0] == family]
        hint = (
            f"known {family} types: {', '.join(same_family)}"
            if same_family
            else f"known types: {', '.join(known_types())}"
        )
        raise UsageError(
            f"no rate for EC2 instance type {instance_type!r} in calque's rates table ({RATES_FILE}); {hint}. "
            "Pick a known type or add a row to the table."
        )
    return row


def hourly_usd(instance_type: str) -> float:
    """On-demand $/hour of one ``instance_type`` instance."""
    return rate(instance_type).usd_per_hour


def vcpus(instance_type: str) -> int:
    """vCPUs of one ``instance_type`` instance (what EC2's vCPU quotas count)."""
    return rate(instance_type).vcpus


def gpus(instance_type: str) -> int:
    """GPUs of one ``instance_type`` instance."""
    return rate(instance_type).gpus


def family(instance_type: str) -> str:
    """The family part of an instance type: ``g6e`` for ``g6e.xlarge``, ``p6-b200`` for ``p6-b200.48xlarge``."""
    return instance_type.split(".", 1)[0]
