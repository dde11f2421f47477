"""A MIG layout as an operation: plan with ``MigPlanner``, apply it, and one rule for what is left over.

The rule (``settle``), the same for ``calque gpu mig apply`` and ``calque.gpu.mig``:

- a MIG mode change waiting for a GPU reset that was not allowed is ``pending="reset"``: success,
  with a warning saying to rerun with allow_reset or reboot;
- a platform that cannot reset a GPU is ``pending="reboot"``: success, ``reboot_required`` true and
  a warning (calque never reboots a host; the caller decides, e.g. ``ansible.builtin.reboot``);
- a reset that was allowed but refused because something holds the GPU is a ``failure`` (exit 1):
  the caller asked for it and it did not happen.

An instance is busy when processes run on it or a live session of the host's session daemon holds
it (``calque.ops.mig_sessions``). Destroying a busy one is refused before anything changes; check
mode says the real run will be refused and what force would do. With force, the sessions on the
instances that go are ended first (reason ``layout``), then their processes are stopped. Where the
host has a session daemon that does not answer, no instance is known to be free of sessions:
destroying any is refused without force, naming the daemon and how to start it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from pydantic import Field, model_validator

from calque.errors import RefusedError, UsageError
from calque.gpu.backend import GpuBackend
from calque.gpu.nvml_errors import BusyInstancesError
from calque.gpu.occupancy import FORCE_HINT
from calque.gpu.planner import (
    BusyInstance,
    MigApplyResult,
    MigPlan,
    MigPlanner,
    MigState,
    SliceHolder,
    current_layout,
)
from calque.models import MigDevice
from calque.models.base import CalqueModel
from calque.ops.base import Operation
from calque.ops.gpu_host import GpuHostRequest
from calque.ops.mig_drain import LayoutDrain, changing_gpus, late_sessions, outside, predicted
from calque.ops.mig_sessions import SessionDaemon
from calque.ops.outcome import Failure, Outcome, Pending

RESET_WARNING = "a MIG mode change is pending a GPU reset: rerun with allow_reset (--allow-reset) or reboot the host"
REBOOT_WARNING = "this platform cannot reset the GPU: reboot the host, then apply the layout again"


class MigRequest(GpuHostRequest):
    """A layout from a file (``config``, ``select``) or inline (``layout``), and what apply may do."""

    config: str | None = None
    select: str | None = None
    layout: list[dict[str, Any]] | None = None
    force: bool = False
    allow_reset: bool = False
    session_socket: str | None = Field(
        None,
        description="the session daemon's socket (default: the one session_config names, else CALQUE_SESSION_SOCKET "
        "or /run/calque/session.sock)",
    )
    session_config: str | None = Field(
        None,
        description="the session daemon's config (default /etc/calque/session.yaml): where it exists a daemon is "
        "expected, and one that does not answer refuses a change that destroys instances (without force)",
    )
    drain: bool = Field(False, description="drain the GPUs the layout changes first, undrain them after")
    drain_wait: int = Field(0, ge=0, description="seconds sessions on destroyed slices may take to run out")
    drain_reason: str = "MIG layout change"
    window: list[str] = Field(default_factory=list, description="UTC times a change may run, e.g. 'Sat 02:00-06:00'")

    @model_validator(mode="after")
    def _one_source(self) -> MigRequest:
        if (self.config is None) == (self.layout is None):
            raise ValueError("give exactly one of config (a layout file) and layout (inline entries)")
        return self


class MigResult(CalqueModel):
    """The MIG devices after the run (as they are, in check mode) and what is still needed."""

    plan: list[str] = Field(default_factory=list, description="the planned operations, one sentence each")
    mig_devices: list[MigDevice] = Field(default_factory=list)
    reset_required: bool = False
    reboot_required: bool = False
    stopped_processes: list[BusyInstance] = Field(
        default_factory=list, description="busy instances destroyed (with force): their pids and sessions"
    )
    ended_sessions: list[SliceHolder] = Field(default_factory=list, description="ended first (reason layout)")
    refusal: str | None = Field(None, description="check mode: why the real run will be refused (busy, no force)")
    requested: dict[str, Any] = Field(
        default_factory=dict, description="check mode: each planned GPU's layout as asked for (also when refused)"
    )


@dataclass
class MigOpPlan:
    request: MigRequest
    backend: GpuBackend
    planner: MigPlanner
    plan: MigPlan
    before: MigState
    daemon: SessionDaemon
    doomed: set[str]  # the MIG device UUIDs the plan destroys
    refusal: str | None = None  # busy instances without force: why the real run is refused
    note: str | None = None  # no session daemon answered
    entries: Any = None  # the layout's entries: a drained apply plans again after its wait
    drained: list[int] | None = None  # with drain: the GPUs drained around the apply
    closed: bool = False  # the refusal is the change window's: nothing may change now


def _doomed(plan: MigPlan, backend: GpuBackend) -> set[str]:
    gone = {(op.gpu_index, op.gi_id) for g in plan.gpus for op in g.ops if op.kind in ("destroy_gi", "destroy_ci")}
    return {d.uuid for d in backend.mig_devices() if (d.gpu_index, d.gi_id) in gone}


def _stops(plan: MigPlan) -> list[str]:
    """What a forced plan ends and stops before its first operation, one sentence each."""
    out = []
    for b in (b for g in plan.gpus for b in g.busy_destroyed):
        where = f"GPU {b.gpu_index}: {b.profile}@{b.start} (GI {b.gi_id})"
        out += [f"{where}: end session {s.session_id} of {s.holder} (reason layout)" for s in b.sessions]
        out += [f"{where}: stop pids {b.pids}"] if b.pids else []
    return out


def settle(applied: MigApplyResult) -> tuple[Pending | None, Failure | None, list[str]]:
    """The one rule for what an apply left undone: pending reboot or reset (success), or a failure."""
    blocked = [g for g in applied.gpus if g.blocked and not g.reboot_required]
    failure = Failure(message="; ".join(f"GPU {g.index}: {g.blocked}" for g in blocked)) if blocked else None
    if applied.reboot_required:
        return "reboot", failure, [REBOOT_WARNING]
    if applied.reset_required:
        return "reset", failure, [] if blocked else [RESET_WARNING]
    return None, failure, []


def _views(state: MigState, indices: set[int]) -> dict[str, Any]:
    """Each GPU's layout; ``mig_pending`` only where a MIG mode change waits for a reset."""
    views: dict[str, Any] = {}
    for g in state.gpus:
        if g.index in indices:
            view: dict[str, Any] = {"mig_enabled": g.layout.mig_enabled, "instances": g.layout.instances}
            if g.mig_pending != g.mig_current:
                view["mig_pending"] = g.mig_pending
            views[f"gpu{g.index}"] = view
    return views


def _requested(plan: MigPlan) -> dict[str, Any]:
    """Each planned GPU's layout as the request asks for it."""
    return {f"gpu{g.index}": g.after.model_dump() for g in plan.gpus}


class MigLayoutOp(Operation[MigRequest, MigOpPlan, MigResult]):
    name = "mig"
    Request = MigRequest

    def plan(self, request: MigRequest) -> MigOpPlan:
        from calque.gpu.layout import load_layout, parse_entries

        if request.config is not None:
            name, entries = load_layout(request.config).select(request.select)
        elif request.select is not None:
            raise UsageError("select names a config of a layout file: give config too, or drop select")
        else:
            name, entries = None, parse_entries(request.layout)
        backend = request.backend()
        planner = MigPlanner(backend)
        daemon = SessionDaemon(request.session_socket, request.session_config)
        holders, note = daemon.holders()
        refusal = None
        try:
            plan = planner.plan(entries, force=request.force, config=name, holders=holders)
        except BusyInstancesError as exc:
            refusal = str(exc)  # apply raises it; check mode says so and shows what force would do
            plan = planner.plan(entries, force=True, config=name, holders=holders)
            if request.drain and request.drain_wait > 0:  # sessions that run out within it are waited for
                refusal = late_sessions(plan, request.drain_wait, time.time())
        doomed = _doomed(plan, backend)
        if daemon.silent is not None and doomed and not request.force:  # sessions may hold them, unseen
            refusal = f"{refusal}; and {daemon.silent}" if refusal else daemon.silent
        changing = changing_gpus(plan, request.allow_reset)
        closed = outside(request.window, datetime.now(timezone.utc)) if changing else None
        drained = changing if request.drain and note is None else None
        return MigOpPlan(
            request, backend, planner, plan, current_layout(backend), daemon, doomed,
            closed or refusal, note, entries, drained, closed is not None,
        )  # fmt: skip

    def check(self, plan: MigOpPlan) -> Outcome[MigResult]:
        p, allow = plan.plan, plan.request.allow_reset
        needs_reset = any(g.needs_reset for g in p.gpus)
        pending: Pending | None = "reset" if needs_reset and not allow else None
        actions = _stops(p) + [op.describe() for g in p.gpus for op in g.ops]
        if plan.drained:
            around = predicted(plan.drained, p, plan.request.drain_wait)
            actions = around + actions + [f"GPU {i}: undrain" for i in plan.drained]
        before = _views(plan.before, {g.index for g in p.gpus})
        # the note of a silent daemon is the refusal itself, unless forced (then: what force does unseen)
        noted = plan.note and plan.doomed and (plan.daemon.silent is None or plan.request.force)
        warnings = [plan.note] if plan.note and noted else []
        if plan.refusal is not None:  # the real run changes nothing: it is refused before any operation
            warnings.append(f"the real run will be refused: {plan.refusal}")
            if not plan.closed:
                warnings.append("with force it would: " + "; ".join(actions))
            # after stays before (the real run changes nothing); the result says what was asked for
            refused = self._result(plan, plan.backend.mig_devices(), False, False, requested=_requested(p))
            return Outcome[MigResult](
                resource=self.name,
                check_mode=True,
                changed=False,
                before=before,
                after=before,
                warnings=warnings,
                result=refused,
            )
        planned = self._result(plan, plan.backend.mig_devices(), needs_reset, False, requested=_requested(p))
        return Outcome[MigResult](
            resource=self.name,
            check_mode=True,
            changed=p.would_change(allow),
            before=before,
            after=_requested(p),
            actions=actions,
            warnings=warnings + ([RESET_WARNING] if pending else []),
            pending=pending,
            result=planned,
        )

    def _end_sessions(self, plan: MigOpPlan) -> list[SliceHolder]:
        """End every live session on a device the plan destroys (listed again now: one checked out
        since the plan is ended too, with force, or refuses the run without it)."""
        ended: list[SliceHolder] = []
        for _ in range(3):
            holders, _note = plan.daemon.holders()
            if plan.daemon.silent is not None and not plan.request.force:  # it stopped answering since the plan
                raise RefusedError(plan.daemon.silent)
            on_doomed = [h for u in sorted(plan.doomed) for h in holders.get(u, [])]
            if not on_doomed:
                return ended
            if not plan.request.force:
                held = "; ".join(f"GPU {h.gpu_index} {h.mig_uuid} {h.describe()}" for h in on_doomed)
                raise BusyInstancesError(f"the layout would destroy held slices: {held}. To change it, {FORCE_HINT}")
            plan.daemon.end_for_layout(on_doomed, self.say)
            ended += on_doomed
        raise RefusedError(
            "sessions keep being checked out on the slices this layout destroys: stop calque-session.service "
            "(or retry when the host is quieter), then apply the layout again"
        )

    def apply(self, plan: MigOpPlan) -> Outcome[MigResult]:
        if plan.refusal is not None:
            raise (RefusedError if plan.closed else BusyInstancesError)(plan.refusal)
        if not plan.drained:
            return self._apply(plan)
        drain = LayoutDrain(plan.daemon, plan.drained, plan.request.drain_reason, self.say)
        try:
            drain.start()
            if plan.doomed:
                drain.wait_out(plan.doomed, plan.request.drain_wait)
                # As the host is now: what ran out is no longer busy; what is left needs force.
                holders, _ = plan.daemon.holders()
                again = plan.planner.plan(
                    plan.entries, force=plan.request.force, config=plan.plan.config, holders=holders
                )
                plan = replace(plan, plan=again, doomed=_doomed(again, plan.backend))
            return self._apply(plan)
        finally:
            drain.release()

    def _apply(self, plan: MigOpPlan) -> Outcome[MigResult]:
        ended = self._end_sessions(plan) if plan.doomed else []
        applied = plan.planner.apply(plan.plan, allow_reset=plan.request.allow_reset, progress=self.say)
        pending, failure, warnings = settle(applied)
        touched = {g.index for g in plan.plan.gpus}
        return Outcome[MigResult](
            resource=self.name,
            changed=applied.changed,
            before=_views(plan.before, touched),
            after=_views(current_layout(plan.backend), touched),
            actions=[f"ended session {h.session_id} of {h.holder} (reason layout)" for h in ended]
            + [op.describe() for g in applied.gpus for op in g.done],
            warnings=warnings,
            pending=pending,
            failure=failure,
            result=self._result(plan, applied.mig_devices, applied.reset_required, applied.reboot_required, ended),
        )

    @staticmethod
    def _result(
        plan: MigOpPlan,
        devices: list[MigDevice],
        reset: bool,
        reboot: bool,
        ended: list[SliceHolder] | None = None,
        requested: dict[str, Any] | None = None,
    ) -> MigResult:
        gpus = plan.plan.gpus
        return MigResult(
            plan=[op.describe() for g in gpus for op in g.ops],
            mig_devices=devices,
            reset_required=reset,
            reboot_required=reboot,
            stopped_processes=[b for g in gpus for b in g.busy_destroyed],
            ended_sessions=ended or [],
            refusal=plan.refusal,
            requested=requested or {},
        )
