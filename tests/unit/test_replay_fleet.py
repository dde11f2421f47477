"""bench/session_fleet.py on the trace: the class's scaling read from calque's documents, and the
simulated group's choices (hand-made requests: the real trace is never needed)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from calque.aws.acquire.fleet_scaling import FleetScalingSettings  # noqa: E402

from bench.replay.fleet_sim import WAIT_S, FleetPolicy, run  # noqa: E402
from bench.replay.pool_demand import Claim  # noqa: E402
from bench.replay.pool_figures import ends  # noqa: E402


def test_the_step_policy_is_read_from_calques_documents() -> None:
    p = FleetPolicy.of(FleetScalingSettings(slices_per_host=2, boot_s=300, idle_s=600, max_step=4))
    assert (p.warmup_s, p.threshold, p.idle_periods) == (300, 1.0, 10)
    # AWS step scaling on metric - threshold: one host per two unserved requests, four at most.
    assert [p.adds(n) for n in (0, 1, 2, 3, 4, 8, 500)] == [0, 1, 1, 2, 2, 4, 4]


def test_an_elastic_class_launches_on_unserved_demand_and_ends_only_idle_hosts() -> None:
    fast, _ = ends()
    policy = FleetPolicy.of(FleetScalingSettings(slices_per_host=1, boot_s=300, idle_s=600))
    reqs = [Claim("long", 0.0, 4 * 3600.0), Claim("short", 0.0, 600.0)]
    o = run("b", reqs, 1, fast, 0.0, 8 * 3600.0, policy=policy, max_hosts=5)
    # Both wait wait_s to count, the metric's lag, a step (2 hosts), then boot + bootstrap + registration.
    assert o.launches == 2 and len(o.waits) == 2
    assert min(o.waits) >= WAIT_S + fast.metric_lag_s + fast.boot_s + fast.bootstrap_s
    # The short session's host goes after 10 idle minutes; the long one's stays until its session ends:
    # well under two hosts for 8 h, over one host for the long session's 4 h.
    assert 4 * 3600 < o.host_s < 2 * 8 * 3600 - 3 * 3600
    fixed = run("a", reqs, 1, fast, 0.0, 8 * 3600.0, fixed=2)
    assert fixed.host_s == 2 * 8 * 3600 and max(fixed.waits) == 0.0
