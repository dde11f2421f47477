"""Plan, then apply, a MIG layout: minimal changes, busy instances protected, resets only when allowed.

``MigPlanner.plan`` compares each selected GPU with its target and lists the operations (the plan is
what check mode shows). Within a GPU it keeps the instances the target still contains at their
placements (as many as possible, never a busy one unless ``force``) and places the rest with a
backtracking search over the card's grid, largest profiles first. A layout that cannot fit fails
before anything changes, naming what is valid on that card. ``apply`` executes a plan; a satisfied
plan does nothing. A MIG mode change needs a GPU reset, which ``apply`` (``mig_applier.py``)
performs only with ``allow_reset`` and when nothing holds the GPU.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from calque.gpu.backend import GpuBackend
from calque.gpu.catalog import COMPUTE_INSTANCE_PROFILES, Card, GiProfile
from calque.gpu.layout import LayoutEntry, card_of
from calque.gpu.mig_applier import apply_plan
from calque.gpu.migmodels import (
    BusyInstance,
    GpuApplyResult,
    GpuLayout,
    GpuMigState,
    GpuPlan,
    MigApplyResult,
    MigOp,
    MigPlan,
    MigState,
    OpKind,
    SliceHolder,
    layout_view,
    runnable,
)
from calque.gpu.nvml_errors import BusyInstancesError, LayoutError
from calque.gpu.occupancy import FORCE_HINT, Occupancy
from calque.gpu.placement import Placed, place, problems
from calque.gpu.stopping import terminate_processes
from calque.models import GpuDevice, GpuInstance, GpuProcess

CI_SIZES = tuple(COMPUTE_INSTANCE_PROFILES)  # kept for callers of the planner's API

__all__ = [
    "CI_SIZES",
    "BusyInstance",
    "GpuApplyResult",
    "GpuLayout",
    "GpuMigState",
    "GpuPlan",
    "MigApplyResult",
    "MigOp",
    "MigPlan",
    "MigPlanner",
    "MigState",
    "OpKind",
    "SliceHolder",
    "catalog_profile",
    "check_indexes",
    "current_layout",
    "runnable",
    "terminate_processes",
    "valid_profiles",
]


def catalog_profile(card: Card, gi: GpuInstance) -> GiProfile:
    """The catalog profile of an existing instance (by name, else by id), or a LayoutError saying why not."""
    found = next((p for p in card.profiles if p.name == gi.profile), None) or card.profile_by_id(gi.profile_id)
    if found is None:
        raise LayoutError(
            f"GPU {gi.gpu_index} has a {gi.profile} instance (profile id {gi.profile_id}) that the catalog's "
            f"{card.key} entry does not know: run `calque gpu verify` and update the catalog"
        )
    return found


def check_indexes(entries: Sequence[LayoutEntry], gpus: Sequence[GpuDevice]) -> None:
    """A layout that names a GPU index this host lacks fails before any change (a typo must not
    silently leave a GPU unconfigured)."""
    present = sorted(g.index for g in gpus)
    named = sorted({i for e in entries for i in e.indexes()})
    missing = [i for i in named if i not in present]
    if missing:
        have = ", ".join(map(str, present)) or "none"
        raise LayoutError(
            f"the layout names GPU {', '.join(map(str, missing))}, which this host does not have "
            f"(its GPU indexes: {have}); fix the entry's devices: or use devices: all"
        )


def valid_profiles(card: Card) -> str:
    return ", ".join(f"{p.name} (max {p.max_count})" for p in card.profiles)


class MigPlanner:
    """Plans and applies MIG layouts on one host's backend."""

    def __init__(self, backend: GpuBackend) -> None:
        self.backend = backend

    # -- planning -----------------------------------------------------------------------------

    def plan(
        self,
        entries: Sequence[LayoutEntry],
        *,
        force: bool = False,
        config: str | None = None,
        holders: Mapping[str, list[SliceHolder]] | None = None,
    ) -> MigPlan:
        """The operations that bring the selected GPUs to ``entries``; raises before any change when the
        layout cannot fit or would destroy busy instances without ``force``. An instance is busy when a
        process runs on it or a live session (``holders``, by MIG device UUID) holds it."""
        gpus = self.backend.gpus()
        procs = self.backend.processes()
        migs = self.backend.mig_devices()
        out = MigPlan(config=config, force=force)
        check_indexes(entries, gpus)
        for gpu in gpus:
            card = card_of(gpu)
            chosen = [e for e in entries if e.selects(gpu, card)]
            if not chosen:
                continue
            if len(chosen) > 1:
                raise LayoutError(f"GPU {gpu.index} is selected by {len(chosen)} layout entries; make them disjoint")
            if card is None:
                raise LayoutError(f"GPU {gpu.index} ({gpu.name}) is not in the catalog; calque cannot plan MIG for it")
            occupancy = Occupancy(gpu.index, procs, migs, holders or {})
            out.gpus.append(self._plan_gpu(gpu, card, chosen[0], occupancy, force))
        return out

    def _plan_gpu(
        self,
        gpu: GpuDevice,
        card: Card,
        entry: LayoutEntry,
        occ: Occupancy,
        force: bool,
    ) -> GpuPlan:
        i = gpu.index
        if entry.mig_enabled and not card.mig:
            raise LayoutError(f"GPU {i} ({card.key}) does not support MIG; share it with MPS instead (calque gpu mps)")
        wanted = self._wanted(card, entry, i)
        existing = self.backend.gpu_instances(i) if gpu.mig_current else []

        def gi_view(gi: GpuInstance) -> tuple[str, int, list[int], int]:
            g = catalog_profile(card, gi).compute_slices
            return gi.profile, gi.placement_start, [c.compute_slices for c in gi.compute_instances] or [g], g

        before = GpuLayout(
            mig_enabled=gpu.mig_current,
            instances=layout_view(gpu.mig_current, [gi_view(g) for g in existing]).instances,
        )
        pending = gpu.mig_pending if gpu.mig_pending != gpu.mig_current else None
        plan = GpuPlan(index=i, card=card.key, before=before, after=before, mig_pending=pending)
        ops = plan.ops

        def split_for(p: GiProfile) -> list[int]:
            return list(entry.compute_instances.get(p.name) or [p.compute_slices])

        if not entry.mig_enabled:
            self._guard_busy([gi for gi in existing if occ.busy(gi)], occ, force, plan)
            for gi in existing:
                ops += self._destroy(i, gi)
            if gpu.mig_pending:
                ops.append(MigOp(kind="set_mig_mode", gpu_index=i, enabled=False, cancels_pending=not gpu.mig_current))
            if gpu.mig_current:
                ops.append(MigOp(kind="reset", gpu_index=i))
                plan.needs_reset = True
            plan.after = GpuLayout(mig_enabled=False)
            return plan

        if not gpu.mig_current:
            if not gpu.mig_pending:
                ops.append(MigOp(kind="set_mig_mode", gpu_index=i, enabled=True))
            ops.append(MigOp(kind="reset", gpu_index=i))
            plan.needs_reset = True
            placed = place(card, [], wanted)
            assert placed is not None  # _wanted checked that it fits an empty card
            ops += [self._create(i, p, s, split_for(p)) for p, s in placed]
            plan.after = layout_view(True, [(p.name, s, split_for(p), p.compute_slices) for p, s in placed])
            return plan
        if not gpu.mig_pending:  # a disable is pending: cancel it (no reset: MIG is still current)
            ops.append(MigOp(kind="set_mig_mode", gpu_index=i, enabled=True, cancels_pending=True))

        keep, placed = self._choose(card, existing, wanted, occ, force)
        dropped = [gi for gi in existing if gi not in keep]
        self._guard_busy([gi for gi in dropped if occ.busy(gi)], occ, force, plan)
        for gi in dropped:
            ops += self._destroy(i, gi)
        after: list[tuple[str, int, list[int], int]] = []
        for gi in keep:
            p = catalog_profile(card, gi)
            have = [c.compute_slices for c in gi.compute_instances]
            want = split_for(p)
            if sorted(have) != sorted(want):
                if have and occ.busy(gi):
                    self._guard_busy([gi], occ, force, plan)
                ops += [
                    MigOp(kind="destroy_ci", gpu_index=i, gi_id=gi.gi_id, ci_id=c.ci_id, profile=gi.profile)
                    for c in gi.compute_instances
                ]
                ops.append(
                    MigOp(kind="create_ci", gpu_index=i, gi_id=gi.gi_id, profile=gi.profile, compute_slices=want)
                )
            after.append((gi.profile, gi.placement_start, want, p.compute_slices))
        for p, s in placed:
            ops.append(self._create(i, p, s, split_for(p)))
            after.append((p.name, s, split_for(p), p.compute_slices))
        plan.after = layout_view(True, after)
        return plan

    def _wanted(self, card: Card, entry: LayoutEntry, i: int) -> list[GiProfile]:
        if not entry.mig_enabled:
            return []
        wanted: list[GiProfile] = []
        for name, n in entry.mig_devices.items():
            try:
                wanted += [card.profile(name)] * n
            except Exception as exc:
                raise LayoutError(f"GPU {i} ({card.key}): {exc}") from exc
        for name, split in entry.compute_instances.items():
            p = card.profile(name)
            bad = [n for n in split if n not in CI_SIZES or n > p.compute_slices]
            if bad:
                sizes = [n for n in CI_SIZES if n <= p.compute_slices]
                raise LayoutError(
                    f"GPU {i} ({card.key}): compute-instances {split} for {name}: no {bad}-slice compute instance "
                    f"fits a {name}; valid sizes: {sizes}"
                )
            if sum(split) > p.compute_slices:
                raise LayoutError(
                    f"GPU {i} ({card.key}): compute-instances {split} for {name} exceed its "
                    f"{p.compute_slices} compute slices"
                )
        if place(card, [], wanted) is None:
            counts = Counter(p.name for p in wanted)
            asked = ", ".join(f"{n}x {name}" for name, n in counts.items())
            why = problems(card, [(p, p.placements.starts[0]) for p in wanted])
            reason = "; ".join(w for w in why if "overlap" not in w) or "no placement on the grid fits them together"
            raise LayoutError(
                f"GPU {i} ({card.key}): {asked} does not fit ({reason}). Valid profiles on {card.key}: "
                f"{valid_profiles(card)}; at most {card.max_instances} instances and {card.compute_slices} compute "
                f"slices on a {card.placement_units}-slice grid"
            )
        return wanted

    def _choose(
        self,
        card: Card,
        existing: list[GpuInstance],
        wanted: list[GiProfile],
        occ: Occupancy,
        force: bool,
    ) -> tuple[list[GpuInstance], list[Placed]]:
        """The largest set of existing instances to keep (busy ones first) and placements for the rest."""
        want = Counter(p.name for p in wanted)
        candidates = [gi for gi in existing if want[gi.profile]]
        busy = [gi for gi in existing if occ.busy(gi)]
        # busy instances first, then by placement: deterministic and protective
        candidates.sort(key=lambda gi: (not occ.busy(gi), gi.placement_start))
        for size in range(len(candidates), -1, -1):
            for keep in itertools.combinations(candidates, size):
                counts = Counter(gi.profile for gi in keep)
                if any(counts[n] > want[n] for n in counts):
                    continue
                if not force and any(b not in keep for b in busy):
                    continue
                rest = list(wanted)
                for gi in keep:
                    rest.remove(next(p for p in rest if p.name == gi.profile))
                fixed = [(catalog_profile(card, gi), gi.placement_start) for gi in keep]
                placed = place(card, fixed, rest)
                if placed is not None:
                    return list(keep), placed
        raise BusyInstancesError(
            f"GPU {occ.index}: the layout cannot be reached without destroying busy instances: "
            f"{occ.describe(busy)}. To change it, {FORCE_HINT}"
        )

    @staticmethod
    def _guard_busy(busy: list[GpuInstance], occ: Occupancy, force: bool, plan: GpuPlan) -> None:
        if not busy:
            return
        if not force:
            raise BusyInstancesError(
                f"GPU {occ.index}: the layout would destroy busy instances: {occ.describe(busy)}. To change it, "
                f"{FORCE_HINT}"
            )
        plan.busy_destroyed += [occ.instance(gi) for gi in busy]

    @staticmethod
    def _destroy(i: int, gi: GpuInstance) -> list[MigOp]:
        ops = [
            MigOp(kind="destroy_ci", gpu_index=i, gi_id=gi.gi_id, ci_id=c.ci_id, profile=gi.profile)
            for c in gi.compute_instances
        ]
        ops.append(MigOp(kind="destroy_gi", gpu_index=i, gi_id=gi.gi_id, profile=gi.profile, start=gi.placement_start))
        return ops

    @staticmethod
    def _create(i: int, p: GiProfile, start: int, split: list[int]) -> MigOp:
        return MigOp(
            kind="create_gi", gpu_index=i, profile=p.name, profile_id=p.profile_id, start=start, compute_slices=split
        )

    # -- applying: calque.gpu.mig_applier -----------------------------------------------------

    def apply(
        self,
        plan: MigPlan,
        *,
        allow_reset: bool = False,
        stop_processes: Callable[[list[GpuProcess]], None] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> MigApplyResult:
        """Execute ``plan``. Operations after a needed reset wait for it (``allow_reset``)."""
        return apply_plan(self.backend, plan, allow_reset=allow_reset, stop_processes=stop_processes, progress=progress)


def current_layout(backend: GpuBackend) -> MigState:
    out = []
    for g in backend.gpus():
        card = card_of(g)
        insts = backend.gpu_instances(g.index) if g.mig_current else []
        view = []
        for gi in insts:
            have = [c.compute_slices for c in gi.compute_instances]
            try:
                total = catalog_profile(card, gi).compute_slices if card else sum(have)
            except LayoutError:  # show what is there even when the catalog lacks the profile
                total = sum(have)
            view.append((gi.profile, gi.placement_start, have or [total], total))
        out.append(
            GpuMigState(
                index=g.index,
                name=g.name,
                card=card.key if card else None,
                mig_current=g.mig_current,
                mig_pending=g.mig_pending,
                layout=layout_view(g.mig_current, view),
                instances=insts,
            )
        )
    return MigState(gpus=out)
