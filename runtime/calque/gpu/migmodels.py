"""The MIG layout's data: a plan's operations, the plan, what apply did, and the host's current layout.

Pydantic models, one definition each; ``calque.gpu.planner`` computes and applies them and
re-exports them, so callers keep importing from the planner.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from calque.models import GpuInstance, MigDevice
from calque.models.base import CalqueModel

OpKind = Literal["destroy_ci", "destroy_gi", "set_mig_mode", "reset", "create_gi", "create_ci"]


class MigOp(CalqueModel):
    """One driver operation of a plan."""

    kind: OpKind
    gpu_index: int
    profile: str | None = None
    profile_id: int | None = None
    start: int | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    enabled: bool | None = None
    compute_slices: list[int] = Field(default_factory=list, description="CIs to create in a new or kept GI")
    cancels_pending: bool = Field(False, description="set_mig_mode back to the current mode: no reset needed")

    def describe(self) -> str:
        where = f"GPU {self.gpu_index}"
        if self.kind == "set_mig_mode":
            mode = "on" if self.enabled else "off"
            if self.cancels_pending:
                return f"{where}: cancel the pending MIG mode change (MIG stays {mode})"
            return f"{where}: set MIG mode {mode} (pending until reset)"
        if self.kind == "reset":
            return f"{where}: reset the GPU"
        if self.kind == "create_gi":
            split = "+".join(f"{n}c" for n in self.compute_slices)
            return f"{where}: create {self.profile} at {self.start} with CIs {split}"
        if self.kind == "create_ci":
            return f"{where}: create CIs {'+'.join(f'{n}c' for n in self.compute_slices)} in GI {self.gi_id}"
        if self.kind == "destroy_gi":
            return f"{where}: destroy {self.profile} at {self.start} (GI {self.gi_id})"
        return f"{where}: destroy CI {self.ci_id} of GI {self.gi_id} ({self.profile})"


class GpuLayout(CalqueModel):
    """A GPU's MIG layout as a person reads it: mode and instances as ``profile@start`` [CI split]."""

    mig_enabled: bool
    instances: list[str] = Field(default_factory=list)


class SliceHolder(CalqueModel):
    """A live session on a MIG device, as the host's session daemon lists it (``holder`` is None when the
    caller may not see who holds it: only root and the daemon's admins do)."""

    mig_uuid: str
    gpu_index: int
    session_id: str | None = None
    holder: str | None = None
    holder_uid: int | None = None
    ends: datetime | None = None

    def describe(self) -> str:
        who = self.holder or "another user"
        ends = f", ends {self.ends.strftime('%Y-%m-%d %H:%M:%S UTC')}" if self.ends else ""
        return f"held by {who} (session {self.session_id or '?'}{ends})"


class BusyInstance(CalqueModel):
    """An instance the layout would destroy that has processes on it or a live session holding it."""

    gpu_index: int
    gi_id: int
    profile: str
    start: int
    pids: list[int]
    sessions: list[SliceHolder] = Field(default_factory=list)

    def describe(self) -> str:
        what = [f"runs pids {self.pids}"] if self.pids else []
        what += [s.describe() for s in self.sessions]
        return f"GPU {self.gpu_index} {self.profile}@{self.start} (GI {self.gi_id}) " + " and ".join(what)


class GpuPlan(CalqueModel):
    index: int
    card: str
    before: GpuLayout
    after: GpuLayout
    mig_pending: bool | None = Field(None, description="the MIG mode waiting for a reset, when it differs")
    ops: list[MigOp] = Field(default_factory=list)
    needs_reset: bool = False
    busy_destroyed: list[BusyInstance] = Field(default_factory=list, description="only with force")


class MigPlan(CalqueModel):
    """What ``apply`` will do (what check mode shows)."""

    version: int = 1
    config: str | None = None
    force: bool = False
    gpus: list[GpuPlan] = Field(default_factory=list)

    @property
    def changes(self) -> bool:
        return any(g.ops for g in self.gpus)

    def would_change(self, allow_reset: bool) -> bool:
        """Whether ``apply`` would run any operation (without ``allow_reset`` it stops at a reset)."""
        return any(runnable(g.ops, allow_reset) for g in self.gpus)


def runnable(ops: Sequence[MigOp], allow_reset: bool) -> list[MigOp]:
    """The operations apply runs: all of them, or those before the first reset when resets are not allowed."""
    if allow_reset:
        return list(ops)
    out = []
    for op in ops:
        if op.kind == "reset":
            break
        out.append(op)
    return out


class GpuApplyResult(CalqueModel):
    index: int
    done: list[MigOp] = Field(default_factory=list)
    reset_required: bool = False
    reboot_required: bool = False
    blocked: str | None = Field(None, description="why the reset could not run")


class MigApplyResult(CalqueModel):
    """What ``apply`` did, and what is still needed (a reset or a reboot)."""

    version: int = 1
    config: str | None = None
    changed: bool
    gpus: list[GpuApplyResult]
    mig_devices: list[MigDevice]
    reset_required: bool = False
    reboot_required: bool = False


def layout_view(mig: bool, instances: Sequence[tuple[str, int, list[int], int]]) -> GpuLayout:
    """instances: (profile, start, ci slices, gi compute slices)."""
    out = []
    for name, start, cis, g in sorted(instances, key=lambda x: (x[1], x[0])):
        split = "" if cis == [g] else " [" + "+".join(f"{n}c" for n in cis) + "]"
        out.append(f"{name}@{start}{split}")
    return GpuLayout(mig_enabled=mig, instances=out)


class GpuMigState(CalqueModel):
    index: int
    name: str
    card: str | None
    mig_current: bool
    mig_pending: bool
    layout: GpuLayout
    instances: list[GpuInstance] = Field(default_factory=list)


class MigState(CalqueModel):
    """The MIG layout of every GPU on the host (``calque gpu mig show``)."""

    version: int = 1
    gpus: list[GpuMigState]


class ProfileDemand(CalqueModel):
    """One MIG profile's recorded demand over the window, and what the suggested layout changes for it."""

    profile: str
    slices_now: int
    slices_suggested: int
    refused_asks: int = Field(
        description="checkouts refused for want of a free slice (one per ask, however often it retried)"
    )
    waited_asks: int = Field(description="of them, asks a later try of which was granted (the client waited)")
    peak_in_use: int = Field(description="most sessions of the profile at once")
    slice_hours_used: float
    slice_hours_idle: float = Field(description="the current layout's slice-hours of the profile that no session used")
    replayed_refusals_now: int = Field(description="refused asks when the history is replayed on the current layout")
    replayed_refusals_suggested: int = Field(description="refused asks when it is replayed on the suggested layout")


class GpuSuggestion(CalqueModel):
    index: int
    card: str | None
    mig_enabled: bool
    before: dict[str, int] = Field(description="GPU-instance profile -> slices now (a split GI: one per CI)")
    after: dict[str, int] = Field(description="GPU-instance profile -> slices suggested")
    changed: bool


class MigSuggestion(CalqueModel):
    """``calque gpu mig suggest``: a layout for one host from its registry's history, with its expected effect."""

    version: int = 1
    host: str
    registry: str
    since: datetime
    until: datetime
    refusals_recorded_since: datetime | None = None
    changed: bool
    refusals_avoided: int = Field(description="replayed refusals on the current layout minus on the suggested one")
    gpus: list[GpuSuggestion]
    profiles: list[ProfileDemand]
    reasons: list[str] = Field(default_factory=list, description="why, in sentences")
    assumptions: list[str] = Field(default_factory=list)
    layout: dict[str, Any] = Field(description="the suggested layout, a mig-parted version: v1 document")
