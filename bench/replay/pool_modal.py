"""Modal as Modal scales, on the same claims: each input goes to a warm container when one is free; when
none is, a new container starts (container start + ``@enter``, or ``@enter`` restored from a memory
snapshot), up to ``max_containers``; a container idle for ``scaledown_window`` stops. Billed per second
from its start to its stop, idle time inside the window included (GPU only; Modal's CPU and memory
charges are left out, which favours Modal).

An input goes to whichever is ready first, a new container or one freed meanwhile; a container is
started only when it is the one chosen (Modal may start one anyway on a queue; left out, in Modal's
favour).
"""

from __future__ import annotations

from dataclasses import dataclass

from .pool_demand import Claim
from .pool_figures import Ends
from .pool_group_sim import Result


@dataclass
class _Container:
    created: float
    free_at: float


def run_modal(
    name: str,
    claims: list[Claim],
    ends: Ends,
    s0: float,
    s1: float,
    usd_s: float,
    first_s: float,
    scaledown_s: float,
    max_containers: int,
    snapshot: bool,
) -> Result:
    out = Result(name)
    enter = ends.enter_s / ends.snapshot_speedup if snapshot else ends.enter_s
    alive: list[_Container] = []
    billed: list[tuple[float, float]] = []
    for c in claims:
        if c.arrival >= s1:
            break
        for k in [k for k in alive if k.free_at + scaledown_s < c.arrival]:  # idle past the window: stopped
            alive.remove(k)
            billed.append((k.created, k.free_at + scaledown_s))
        soonest = min(alive, key=lambda k: k.free_at, default=None)
        cold = c.arrival + ends.modal_start_s + enter
        if soonest is not None and (soonest.free_at <= cold or len(alive) >= max_containers):
            start, box = max(c.arrival, soonest.free_at), soonest
        else:
            box = _Container(c.arrival, cold)
            alive.append(box)
            out.starts += 1
            start = cold
        box.free_at = start + c.work
        if c.arrival >= s0:
            out.ttfr.append(start - c.arrival + min(c.work, first_s))
    billed += [(k.created, min(s1, k.free_at + scaledown_s)) for k in alive]
    out.usd = usd_s * sum(max(0.0, min(b, s1) - max(a, s0)) for a, b in billed)
    return out
