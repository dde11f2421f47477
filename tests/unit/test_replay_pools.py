"""bench/replay's pool replay: its pure parts on hand-made claims (the real trace is never needed).

The hour-of-week fit never reads the weeks it is scored on; the schedule it makes is calque's own
scheduled actions; the group model reads calque's scaling documents and scales in only idle instances.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from calque.aws.acquire.scaling import ScalingSettings  # noqa: E402
from calque.aws.acquire.schedule import recurring_actions  # noqa: E402

from bench.replay.pool_demand import WEEK, Claim, claims_of, demand_by_hour, fit_hour_of_week  # noqa: E402
from bench.replay.pool_figures import ends  # noqa: E402
from bench.replay.pool_group_sim import Group, Instance, Policy, run, scale_in_choice  # noqa: E402
from bench.replay.pool_modal import run_modal  # noqa: E402
from bench.replay.pools import schedule_entries  # noqa: E402
from bench.replay.trace import Task  # noqa: E402

H = 3600.0


def _history() -> list[Claim]:
    """Two weeks with demand at hour 10 of each week (3 claims at once in week 0, 1 in week 1)."""
    return [Claim(f"w0-{i}", 10 * H + 60 * i, 1800) for i in range(3)] + [Claim("w1", WEEK + 10 * H, 600)]


def test_the_fit_reads_only_weeks_before_the_scored_one() -> None:
    history = _history()
    fit = fit_hour_of_week(history, 0.0, 2 * WEEK, quantile=1.0, headroom=1, cap=50)
    assert fit[10] == 4 and sum(fit) == 4  # the busiest earlier week at hour 10 (3), plus headroom
    # the scored week's own demand, and any later, changes nothing: the fit never reads it
    future = [Claim("w2", 2 * WEEK + 10 * H, 600)] * 40 + [Claim("w2b", 2 * WEEK + 30 * H, 60)] * 9
    assert fit_hour_of_week(history + future, 0.0, 2 * WEEK, 1.0, 1, 50) == fit
    # a claim still running when the scored week starts was observable only as running until then
    long = Claim("long", WEEK + 160 * H, 10 * WEEK)
    longer = Claim("long", WEEK + 160 * H, 20 * WEEK)
    assert demand_by_hour([*history, long], 0.0, 2 * WEEK) == demand_by_hour([*history, longer], 0.0, 2 * WEEK)
    assert fit_hour_of_week(history, 0.0, 0.5 * WEEK, 1.0, 1, 50) == [0] * 168  # no whole earlier week


def test_the_median_over_weeks_and_the_cap() -> None:
    fit = fit_hour_of_week(_history(), 0.0, 2 * WEEK, quantile=0.0, headroom=0, cap=2)
    assert fit[10] == 1  # the quieter week's peak
    assert fit_hour_of_week(_history(), 0.0, 2 * WEEK, 1.0, 5, 2)[10] == 2


def test_the_schedule_is_calques_own_scheduled_actions() -> None:
    per_hour = [0] * 168
    per_hour[24 + 9] = 3  # day 1, 09:00
    per_hour[48] = 2  # day 2, 00:00: no lead (a window with a weekday may not start the day before)
    actions = recurring_actions(schedule_entries(per_hour), 0)
    assert actions["calque-sched-how-d1h09-start"] == {"MinSize": 3, "Recurrence": "50 8 * * 1", "TimeZone": "UTC"}
    assert actions["calque-sched-how-d1h09-end"]["Recurrence"] == "49 9 * * 1"
    assert actions["calque-sched-how-d2h00-start"]["Recurrence"] == "0 0 * * 2"


def test_whole_gpu_tasks_become_one_claim_per_gpu() -> None:
    def task(name: str, gpus: int, milli: int, created: float, end: float | None) -> Task:
        return Task(name, gpus, milli, "LS", "Running", created, created if end else None, end)

    claims, aside = claims_of(
        [
            task("two", 2, 1000, 100, 700),
            task("half", 1, 500, 100, 700),
            task("old", 1, 1000, -50, 400),  # still running at the start: arrives then with what it had left
            task("pending", 1, 1000, 100, None),
        ],
        0.0,
        1000.0,
    )
    assert [(c.task, c.arrival, c.work) for c in claims] == [("old", 0.0, 400.0), ("two", 100, 600), ("two", 100, 600)]
    assert aside == {"fraction of a GPU (the session replay's)": 1, "never scheduled (no run time)": 1}


def test_the_policy_is_read_from_calques_documents() -> None:
    p = Policy.of(ScalingSettings(seconds_per_claim=60, latency_s=600, idle_s=900, buffer=2))
    assert (p.target, p.buffer_claims, p.wake_capacity, p.idle_periods, p.idle_capacity) == (10, 20, 1, 15, 0)


def test_scale_in_never_picks_a_busy_instance_and_balances_zones() -> None:
    busy = Instance(0, 0, 0, az=0, busy_until=5000)
    idle = [Instance(0, 0, 0, az=0), Instance(0, 0, 0, az=1), Instance(0, 0, 0, az=0)]
    chosen = scale_in_choice([busy, *idle], 3, 1000, random.Random(1))
    assert busy not in chosen and len(chosen) == 3
    assert chosen[0].az == 0  # the zone with the most instances goes first


def test_a_cold_pool_pays_its_boot_and_a_fixed_one_does_not() -> None:
    fast = ends()[0]
    claims = [Claim("c", WEEK + 3 * H, 600)]
    fixed = run(Group("fixed", None, 1), claims, fast, 0.0, WEEK, 2 * WEEK, 1.0, 6.0, 1)
    cold_policy = Policy.of(ScalingSettings(seconds_per_claim=600, latency_s=600))
    cold = run(Group("cold", cold_policy, 1), claims, fast, 0.0, WEEK, 2 * WEEK, 1.0, 6.0, 1)
    assert fixed.ttfr == [6.0]
    boot = fast.boot_s + fast.bootstrap_s + fast.enter_s
    assert boot < cold.ttfr[0] <= boot + fast.metric_lag_s + 2 * 60 + 6
    assert cold.usd < fixed.usd / 10  # an hour or so of one instance, against the week


def test_modal_reuses_a_container_within_its_scaledown_window() -> None:
    fast = ends()[0]
    claims = [Claim("a", 0, 100), Claim("b", 140, 100), Claim("c", 1000, 100)]
    r = run_modal("m", claims, fast, 0.0, 2000.0, 1.0, 6.0, 60.0, 10, snapshot=False)
    assert r.starts == 2  # b within 60 s of a's end reuses it; c, long after, starts cold again
    assert r.ttfr[1] == 6.0
