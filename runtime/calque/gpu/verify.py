"""``calque gpu verify``: compare the catalog with what NVML reports on this host's cards (read-only).

Only NVML getters are called: device names, memory, MIG mode, GPU-instance profile info and possible
placements. A check the driver cannot answer (e.g. profiles while MIG mode is off) becomes a note,
never a change to the card.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from calque.gpu import nvml_errors as nv
from calque.gpu.catalog import Card, load_catalog
from calque.gpu.nvml import DriverProfile, NvmlBackend
from calque.models.base import CalqueModel

MEMORY_TOLERANCE = 0.02  # drivers report slightly different totals; beyond 2% is a difference


class Difference(CalqueModel):
    """One value where the catalog and the card disagree."""

    gpu_index: int
    card: str | None
    profile: str | None = None
    field: str
    catalog: Any = None
    driver: Any = None
    uncertain: bool = Field(False, description="the catalog marked this value as inferred")


class VerifiedGpu(CalqueModel):
    index: int
    name: str
    uuid: str
    card: str | None
    memory_mib: int
    mig_current: bool
    mig_supported: bool | None = None
    profiles_checked: int = 0
    confirmed: list[str] = Field(
        default_factory=list, description="values the catalog marks uncertain that this card confirmed (profile.field)"
    )
    notes: list[str] = Field(default_factory=list)


class VerifyReport(CalqueModel):
    """Every difference between the catalog and this host's cards."""

    version: int = 1
    driver_version: str
    gpus: list[VerifiedGpu]
    differences: list[Difference]

    @property
    def ok(self) -> bool:
        return not self.differences


def _compare_profiles(
    i: int, card: Card, driver: dict[int, DriverProfile], out: list[Difference], confirmed: list[str]
) -> int:
    by_name = {p.name: p for p in driver.values() if p.name}  # v1 profile info has no name
    checked = 0
    for cp in card.profiles:
        dp = by_name.get(cp.name) or driver.get(cp.profile_id)
        u = set(cp.uncertain)
        if dp is None:
            out.append(
                Difference(gpu_index=i, card=card.key, profile=cp.name, field="present", catalog=True, driver=False)
            )
            continue
        checked += 1

        matched: set[str] = set()
        differed: set[str] = set()

        def diff(
            field: str,
            cat: Any,
            drv: Any,
            mark: str | None = None,
            p: str = cp.name,
            u: set[str] = u,
            matched: set[str] = matched,
            differed: set[str] = differed,
        ) -> None:
            (matched if cat == drv else differed).add(mark or field)
            if cat != drv:
                out.append(
                    Difference(
                        gpu_index=i,
                        card=card.key,
                        profile=p,
                        field=field,
                        catalog=cat,
                        driver=drv,
                        uncertain=(mark or field) in u,
                    )
                )

        if dp.name:
            diff("name", cp.name, dp.name)
        diff("profile_id", cp.profile_id, dp.profile_id)
        diff("nvml_constant", cp.nvml_constant, dp.constant)
        diff("compute_slices", cp.compute_slices, dp.compute_slices)
        diff("max_count", cp.max_count, dp.max_count)
        diff("placements", cp.placements.starts, dp.starts)
        diff("memory_slices", cp.memory_slices, dp.size, "placements")
        if cp.sms is not None or "sms" in u:
            diff("sms", cp.sms, dp.sms)
        if cp.memory_gib is not None:
            cat_mib = int(cp.memory_gib * 1024)
            if abs(cat_mib - dp.memory_mib) > MEMORY_TOLERANCE * max(cat_mib, 1):
                diff("memory_mib", cat_mib, dp.memory_mib, "memory_gib")
            else:
                matched.add("memory_gib")
        confirmed += [f"{cp.name}.{m}" for m in sorted((matched - differed) & u)]
    known = {p.name for p in card.profiles} | {p.profile_id for p in card.profiles}
    for dp in driver.values():
        if dp.name not in known and dp.profile_id not in known:
            out.append(
                Difference(gpu_index=i, card=card.key, profile=dp.name, field="present", catalog=False, driver=True)
            )
    return checked


def verify(backend: NvmlBackend) -> VerifyReport:
    """Compare every GPU on the host with its catalog entry; read-only."""
    cat = load_catalog()
    diffs: list[Difference] = []
    gpus: list[VerifiedGpu] = []
    for g in backend.gpus():
        pci = backend.pci_device_id(g.index)
        card = cat.find_card(g.name)
        if card is None and pci is not None:  # a name the catalog lacks: recognise the card by its PCI id
            card = next((c for c in cat.cards.values() if pci.upper() in (x.upper() for x in c.pci_device_ids)), None)
        v = VerifiedGpu(
            index=g.index,
            name=g.name,
            uuid=g.uuid,
            card=card.key if card else None,
            memory_mib=g.memory_mib,
            mig_current=g.mig_current,
        )
        gpus.append(v)
        if card is None:
            diffs.append(Difference(gpu_index=g.index, card=None, field="card", catalog=None, driver=g.name))
            v.notes.append(f"{g.name!r} is not in the catalog; known: {', '.join(cat.cards)}")
            continue
        # (the catalog's field, the difference's name, the catalog's value, the driver's, whether they agree)
        checks: list[tuple[str, str, Any, Any, bool]] = [
            ("nvml_names", "nvml_name", card.nvml_names, g.name, g.name in card.nvml_names)
        ]
        if pci is not None and card.pci_device_ids:
            agree = pci.upper() in (x.upper() for x in card.pci_device_ids)
            checks.append(("pci_device_ids", "pci_device_id", card.pci_device_ids, pci, agree))
        agree = abs(card.memory_mib - g.memory_mib) <= MEMORY_TOLERANCE * card.memory_mib
        checks.append(("memory_mib", "memory_mib", card.memory_mib, g.memory_mib, agree))
        confirmed = {f for f, _, _, _, ok in checks if ok and f in card.uncertain}
        v.confirmed += [f"card.{f}" for f in ("nvml_names", "memory_mib", "pci_device_ids") if f in confirmed]
        diffs += [
            Difference(gpu_index=g.index, card=card.key, field=name, catalog=c, driver=d, uncertain=f in card.uncertain)
            for f, name, c, d, ok in checks
            if not ok
        ]
        supported = g.mig_current or g.mig_pending or _mig_supported(backend, g.index)
        v.mig_supported = supported
        if supported != card.mig:
            diffs.append(Difference(gpu_index=g.index, card=card.key, field="mig", catalog=card.mig, driver=supported))
        if not card.mig:
            continue
        try:  # drivers may answer profile queries with MIG off too; only a getter, so ask
            driver = backend.driver_profiles(g.index)
        except nv.GpuDriverError as exc:
            driver = {}
            if g.mig_current:
                v.notes.append(f"profile table not readable: {exc}")
                continue
        if not driver and not g.mig_current:
            v.notes.append("MIG mode is off and the driver lists no profiles then: profile table not compared")
            continue
        if not g.mig_current:
            v.notes.append("MIG mode is off; the driver listed its profiles anyway")
        v.profiles_checked = _compare_profiles(g.index, card, driver, diffs, v.confirmed)
    return VerifyReport(driver_version=backend.driver_version(), gpus=gpus, differences=diffs)


def _mig_supported(backend: NvmlBackend, index: int) -> bool:
    """MIG capability of a card whose MIG mode is off: GetMigMode answers NOT_SUPPORTED on MIG-less cards."""
    try:
        backend.mig_mode_raw(index)
    except nv.GpuNotSupported:
        return False
    return True
