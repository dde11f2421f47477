"""MPS control daemons as an operation: started (with default client limits) or stopped, per GPU or MIG device.

The plan is ``MpsControl.plan_start``/``plan_stop``: per daemon, the actions and its predicted state
after them, so check mode's ``after`` is the runtime's prediction, never re-guessed by a caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from calque.gpu.mps_control import DEFAULT_LOG_ROOT, DEFAULT_PIPE_ROOT, MpsControl, require_consent
from calque.models.base import CalqueModel
from calque.models.mps import MpsDaemon, MpsSettings, MpsStep, MpsUserModel
from calque.ops.base import Operation, validated
from calque.ops.gpu_host import GpuHostRequest
from calque.ops.outcome import Outcome


class MpsRequest(GpuHostRequest):
    """The daemons asked for; changing anything needs the no-isolation consent."""

    state: Literal["started", "stopped"] = "started"
    gpus: list[int] | None = None
    per_mig: bool = False
    active_thread_percentage: int | None = None
    pinned_memory_limit: str | None = None
    pipe_root: str = str(DEFAULT_PIPE_ROOT)
    log_root: str = str(DEFAULT_LOG_ROOT)
    i_understand_shared_gpu_has_no_isolation: bool = False


class MpsOpResult(CalqueModel):
    """Every managed daemon after the run (as it is, in check mode)."""

    daemons: list[MpsDaemon]
    actions: list[str] = Field(default_factory=list)
    user_model: MpsUserModel | None = None


@dataclass
class MpsPlan:
    request: MpsRequest
    control: MpsControl
    steps: list[MpsStep]


def view(daemons: list[MpsDaemon]) -> dict[str, Any]:
    """What a person compares: each daemon's state, limits and its GPU's compute mode."""
    return {
        d.target: {
            "running": d.running,
            "active_thread_percentage": d.active_thread_percentage,
            "pinned_memory_limit": d.pinned_memory_limit,
            "compute_mode": d.compute_mode,
        }
        for d in daemons
    }


class MpsDaemonsOp(Operation[MpsRequest, MpsPlan, MpsOpResult]):
    name = "mps"
    Request = MpsRequest

    def plan(self, request: MpsRequest) -> MpsPlan:
        require_consent(request.i_understand_shared_gpu_has_no_isolation)
        limits: dict[str, Any] = {
            "active_thread_percentage": request.active_thread_percentage,
            "pinned_memory_limit": request.pinned_memory_limit,
        }
        settings = validated(MpsSettings, limits, "invalid MPS limits")
        ctl = MpsControl(request.backend(), pipe_root=request.pipe_root, log_root=request.log_root)
        if request.state == "started":
            steps = ctl.plan_start(settings, request.gpus, request.per_mig)
        else:
            steps = ctl.plan_stop(request.gpus, request.per_mig)
        return MpsPlan(request, ctl, steps)

    def check(self, plan: MpsPlan) -> Outcome[MpsOpResult]:
        return self._outcome(plan, [st.before for st in plan.steps], [st.after for st in plan.steps], True)

    def apply(self, plan: MpsPlan) -> Outcome[MpsOpResult]:
        changed = any(st.actions for st in plan.steps)
        after = plan.control.run_steps(plan.steps, self.say) if changed else [st.before for st in plan.steps]
        return self._outcome(plan, after, after, False)

    def _outcome(
        self, plan: MpsPlan, daemons: list[MpsDaemon], after: list[MpsDaemon], check_mode: bool
    ) -> Outcome[MpsOpResult]:
        actions = [a for st in plan.steps for a in st.actions]
        return Outcome[MpsOpResult](
            resource=self.name,
            check_mode=check_mode,
            changed=bool(actions),
            before=view([st.before for st in plan.steps]),
            after=view(after),
            actions=actions,
            result=MpsOpResult(daemons=daemons, actions=actions, user_model=plan.control.user_model()),
        )
