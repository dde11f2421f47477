"""A pool's scaling defaults from its script's Modal knobs, with inventory over them, as an operation.

Read-only (it changes nothing, in check mode or not): ``plan`` reads the script's decorator
(``calque.pool.submitter.knobs``) and resolves each value in order, inventory, then the script, then calque's
default, saying where it came from. pool.yml runs it first so the spend gate, the group and its
scaling all use the same values, and ``--diff`` shows their sources:

- ``min_containers`` -> the group's ``min_size``; ``max_containers`` -> ``max_size`` (each divided by
  the spec's ``workers`` per instance, rounded up: one container is one worker process);
- ``buffer_containers`` -> the scaling's ``buffer``: instances kept beyond the backlog's need while
  the pool is active (the idle alarm still takes it to ``min_size``);
- ``scaledown_window`` -> the scaling's ``idle_s`` (the idle alarm's period; at least 60 s, CloudWatch's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import Field

from calque.models.base import CalqueModel
from calque.models.warmth import ModalKnobs, ScalingDefaults, ScalingValue
from calque.ops.base import Operation
from calque.ops.outcome import Outcome
from calque.pool.submitter.knobs import read_knobs

DEFAULT_IDLE_S = 900
MIN_IDLE_S = 60


class PoolKnobsRequest(CalqueModel):
    """The script and what inventory sets (None: not set there)."""

    script: str = Field(description="the workload script on the controller, optionally ::Target")
    workers: int = Field(1, ge=1, le=64, description="worker processes per instance (the spec's workers)")
    min_size: int | None = Field(None, ge=0, description="calque_pool_group.min_size")
    max_size: int | None = Field(None, ge=0, description="calque_pool_group.max_size")
    count: int | None = Field(None, ge=0, description="calque_pool_group.count")
    buffer: int | None = Field(None, ge=0, description="calque_pool_scaling.buffer")
    idle_s: int | None = Field(None, ge=60, description="calque_pool_scaling.idle_s")


@dataclass
class PoolKnobsPlan:
    request: PoolKnobsRequest
    knobs: ModalKnobs | None
    resolved: ScalingDefaults


def _per_instance(containers: int, workers: int) -> int:
    return math.ceil(containers / workers)


def resolve(r: PoolKnobsRequest, knobs: ModalKnobs | None) -> ScalingDefaults:
    """Each value with its source: inventory, else the script's knob (per instance), else the default."""
    on = f" on {knobs.target}" if knobs else ""
    per = f", / {r.workers} workers per instance" if r.workers > 1 else ""

    def pick(inv: int | None, inv_name: str, knob: str, default: int | None, default_src: str) -> ScalingValue:
        if inv is not None:
            return ScalingValue(value=inv, source=f"inventory ({inv_name})")
        raw = getattr(knobs, knob) if knobs else None
        if raw is not None:
            value = raw if knob == "scaledown_window" else _per_instance(raw, r.workers)
            src = f"script: {knob}={raw}{on}{'' if knob == 'scaledown_window' else per}"
            if knob == "scaledown_window" and value < MIN_IDLE_S:
                value, src = MIN_IDLE_S, src + f" (raised to {MIN_IDLE_S}s: CloudWatch's alarm period)"
            return ScalingValue(value=value, source=src)
        return ScalingValue(value=default, source=default_src)

    count_src = "inventory (calque_pool_group.count)" if r.count is not None else "unset"
    return ScalingDefaults(
        min_size=pick(r.min_size, "calque_pool_group.min_size", "min_containers", 0, "calque's default"),
        max_size=pick(r.max_size, "calque_pool_group.max_size", "max_containers", r.count, count_src),
        buffer=pick(r.buffer, "calque_pool_scaling.buffer", "buffer_containers", 0, "calque's default"),
        idle_s=pick(r.idle_s, "calque_pool_scaling.idle_s", "scaledown_window", DEFAULT_IDLE_S, "calque's default"),
        workers=r.workers,
    )


class PoolKnobsOp(Operation[PoolKnobsRequest, PoolKnobsPlan, ScalingDefaults]):
    name = "pool_knobs"
    Request = PoolKnobsRequest

    def plan(self, request: PoolKnobsRequest) -> PoolKnobsPlan:
        knobs = read_knobs(request.script)
        return PoolKnobsPlan(request, knobs, resolve(request, knobs))

    def check(self, plan: PoolKnobsPlan) -> Outcome[ScalingDefaults]:
        return self._outcome(plan, True)

    def apply(self, plan: PoolKnobsPlan) -> Outcome[ScalingDefaults]:
        return self._outcome(plan, False)

    def _outcome(self, plan: PoolKnobsPlan, check_mode: bool) -> Outcome[ScalingDefaults]:
        d = plan.resolved
        r = plan.request
        shown = {
            k: f"{getattr(d, k).value} ({getattr(d, k).source})" for k in ("min_size", "max_size", "buffer", "idle_s")
        }
        return Outcome[ScalingDefaults](
            resource=self.name,
            check_mode=check_mode,
            changed=False,
            before={"inventory": r.model_dump(include={"min_size", "max_size", "count", "buffer", "idle_s"})},
            after=shown,
            actions=[],
            warnings=list(plan.knobs.notes) if plan.knobs else [],
            result=d,
        )
