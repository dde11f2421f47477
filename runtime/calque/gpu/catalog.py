"""The GPU catalog: MIG profile tables per card and the EC2 families that carry each card.

Package data (``calque/data/gpu-catalog.yaml``), loaded once into pydantic models. Values inferred
rather than observed carry ``uncertain`` marks; ``calque gpu verify`` compares them with a real card.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import Field

from calque.errors import UsageError
from calque.models.base import CalqueModel

CATALOG_VERSION = 1

# The one compute-instance size table: compute slices -> suffix of NVML_COMPUTE_INSTANCE_PROFILE_*
# (NVML API Reference, Multi Instance GPU Management). The planner checks splits against it, the
# simulator refuses other sizes, and the NVML backend turns a size into the driver's constant.
COMPUTE_INSTANCE_PROFILES: dict[int, str] = {
    1: "1_SLICE",
    2: "2_SLICE",
    3: "3_SLICE",
    4: "4_SLICE",
    6: "6_SLICE",
    7: "7_SLICE",
    8: "8_SLICE",
}


class Placements(CalqueModel):
    """Where a GPU-instance profile may start on the card's memory-slice grid, and how many slices it covers."""

    starts: list[int]
    size: int = Field(ge=1)


class GiProfile(CalqueModel):
    """One GPU-instance profile (a row of ``nvidia-smi mig -lgip``)."""

    name: str
    profile_id: int = Field(ge=0, description="nvidia-smi 'Profile ID' (CreateGpuInstance id)")
    nvml_constant: str = Field(description="suffix of NVML_GPU_INSTANCE_PROFILE_* passed to GetProfileInfo")
    compute_slices: int = Field(ge=1)
    memory_slices: int = Field(ge=1)
    max_count: int = Field(ge=1)
    placements: Placements
    sms: int | None = None
    memory_gib: float | None = None
    uncertain: list[str] = Field(default_factory=list)
    note: str | None = None

    @property
    def media_extension(self) -> bool:
        """Profiles that take the card's media engines (+me, +me.all); the driver allows one at a time."""
        return "+me" in self.name


class Card(CalqueModel):
    """One GPU model: how NVML names it, its memory, and its MIG profile table (empty when MIG-less)."""

    key: str = ""
    nvml_names: list[str]
    memory_gb: int
    memory_mib: int
    mig: bool
    max_instances: int = Field(ge=0)
    placement_units: int = Field(ge=0, description="memory slices in the placement grid")
    min_driver: str | None = None
    pci_device_ids: list[str] = Field(default_factory=list)
    profiles: list[GiProfile] = Field(default_factory=list)
    uncertain: list[str] = Field(default_factory=list)
    uncertain_note: str | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def compute_slices(self) -> int:
        """Total compute slices (the 'g' of the whole-card profile)."""
        return max((p.compute_slices for p in self.profiles), default=0)

    def profile(self, name: str) -> GiProfile:
        wanted = name.removeprefix("MIG ").strip()
        for p in self.profiles:
            if p.name == wanted:
                return p
        raise UsageError(
            f"{self.key} has no MIG profile {name!r}; valid profiles: "
            + (", ".join(f"{p.name} (max {p.max_count})" for p in self.profiles) or "none (MIG-less card)")
        )

    def profile_by_id(self, profile_id: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.profile_id == profile_id), None)

    def profile_memory_mib(self, p: GiProfile) -> int:
        if p.memory_gib is not None:
            return int(p.memory_gib * 1024)
        if not self.placement_units:
            return 0
        return self.memory_mib * p.memory_slices // self.placement_units

    def profile_sms(self, p: GiProfile) -> int | None:
        if p.sms is not None:
            return p.sms
        full = next((q for q in self.profiles if q.compute_slices == self.compute_slices and q.sms), None)
        return None if full is None or full.sms is None else full.sms * p.compute_slices // self.compute_slices


class Ec2Family(CalqueModel):
    """An EC2 instance family: which card it carries, GPUs per size, and how it can be shared."""

    card: str
    sharing: Literal["mig", "mps"] = Field(description="mig: MIG-capable (MPS also works); mps: MPS only")
    sizes: dict[str, int]
    source: str
    uncertain: bool = False


class Catalog(CalqueModel):
    """Every card and EC2 family calque knows."""

    version: int = CATALOG_VERSION
    cards: dict[str, Card]
    ec2_families: dict[str, Ec2Family]

    def card(self, key: str) -> Card:
        """A card by catalog key (case-insensitive) or by the name NVML reports."""
        found = self.find_card(key)
        if found is None:
            raise UsageError(f"unknown GPU card {key!r}; known cards: {', '.join(self.cards)}")
        return found

    def find_card(self, name: str) -> Card | None:
        low = name.strip().lower()
        for key, c in self.cards.items():
            if key.lower() == low or any(n.lower() == low for n in c.nvml_names):
                return c
        return None

    def for_instance_type(self, instance_type: str) -> tuple[Card, int]:
        """The card and GPU count of an EC2 instance type such as ``p4d.24xlarge``."""
        m = re.fullmatch(r"([a-z0-9-]+)\.([a-z0-9-]+)", instance_type.strip())
        fam = self.ec2_families.get(m.group(1)) if m else None
        if m is None or fam is None:
            raise UsageError(
                f"unknown GPU instance type {instance_type!r}; known families: {', '.join(self.ec2_families)}"
            )
        count = fam.sizes.get(m.group(2))
        if count is None:
            raise UsageError(
                f"unknown size {m.group(2)!r} for {m.group(1)}; known sizes: {', '.join(fam.sizes) or 'none'}"
            )
        return self.card(fam.card), count


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """The catalog shipped with the runtime (cached; treat it as read-only)."""
    text = resources.files("calque").joinpath("data/gpu-catalog.yaml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    if doc.get("version") != CATALOG_VERSION:
        raise UsageError(f"gpu-catalog.yaml has version {doc.get('version')!r}; this runtime reads {CATALOG_VERSION}")
    for key, card in doc["cards"].items():
        card["key"] = key
    return Catalog.model_validate(doc)


def _yes(b: bool) -> str:
    return "yes" if b else "no"


def support_matrix_markdown(cat: Catalog | None = None) -> str:
    """docs/gpu-support-matrix.md, generated from the catalog (a test fails when the two differ)."""
    cat = cat or load_catalog()
    out = [
        "# GPU support matrix",
        "",
        "<!-- Generated from runtime/calque/data/gpu-catalog.yaml by scripts/gen-gpu-matrix; do not edit. -->",
        "",
        "Values marked with `?` were inferred rather than observed (the catalog's `uncertain` marks);",
        "run `calque gpu verify` on a host with the card to compare them with what the driver reports.",
        "",
        "## EC2 families",
        "",
        "| family | card | sharing | GPUs per size |",
        "|---|---|---|---|",
    ]
    for name, fam in cat.ec2_families.items():
        sizes = ", ".join(f"{s}: {n}" for s, n in fam.sizes.items())
        mark = " ?" if fam.uncertain else ""
        sharing = "MIG + MPS" if fam.sharing == "mig" else "MPS only"
        out.append(f"| {name}{mark} | {fam.card} | {sharing} | {sizes} |")
    out += [
        "",
        "## Cards",
        "",
        "| card | NVML name | memory | MIG | max instances | grid |",
        "|---|---|---|---|---|---|",
    ]
    for key, c in cat.cards.items():
        q = {u: " ?" for u in c.uncertain}
        out.append(
            f"| {key} | {c.nvml_names[0]}{q.get('nvml_names', '')} | {c.memory_mib} MiB{q.get('memory_mib', '')} "
            f"| {_yes(c.mig)} | {c.max_instances or '-'} | {c.placement_units or '-'}{q.get('placement_units', '')} |"
        )
    for key, c in cat.cards.items():
        if not c.profiles:
            continue
        out += ["", f"### {key}", ""]
        if c.uncertain_note:
            out += [f"Uncertain: {c.uncertain_note}", ""]
        out += ["| profile | id | NVML constant | g | mem slices | max | starts | SMs | GiB |"]
        out.append("|---|---|---|---|---|---|---|---|---|")
        for p in c.profiles:
            u = set(p.uncertain)

            def m(field: str, value: object, u: set[str] = u) -> str:
                text = "-" if value is None else str(value)
                return f"{text} ?" if field in u else text

            starts = ",".join(str(s) for s in p.placements.starts)
            out.append(
                f"| {p.name} | {m('profile_id', p.profile_id)} | {m('nvml_constant', p.nvml_constant)} "
                f"| {p.compute_slices} | {m('memory_slices', p.memory_slices)} | {p.max_count} "
                f"| {m('placements', starts)} | {m('sms', p.sms)} | {m('memory_gib', p.memory_gib)} |"
            )
    return "\n".join(out) + "\n"
