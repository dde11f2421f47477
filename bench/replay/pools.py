"""``python -m bench.replay.pools --trace PATH``: the trace's whole-GPU tasks as one pool's claims, served
by an always-on pool, by calque's scaling from zero (cold, warm pool, warm pool + a schedule fitted on
earlier weeks) and by Modal as Modal scales; scored on held-out weeks only, at both ends of every
modelled figure's range (issue 37, parts 3 and 4).

    .venv/bin/python -m bench.replay.pools --trace ../shared/data/traces/alibaba-gpu-v2023-pods.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from calque.aws.acquire.scaling import ScalingSettings
from calque.aws.acquire.schedule import recurring_actions
from calque.aws.pricing import rate
from calque.ledger.prices import modal_usd_per_gpu_second
from calque.models.warmth import ModalKnobs, ScheduleEntry, WarmPoolSettings
from calque.ops.pool_knobs import PoolKnobsRequest, resolve

from .mapping import DAY
from .pool_demand import WEEK, Claim, claims_of, demand_by_hour, fit_hour_of_week
from .pool_figures import AWS_DOCS, FIGURES, Ends, ends
from .pool_group_sim import Actions, Group, Policy, Result, run
from .pool_modal import run_modal
from .report import pct
from .trace import TraceError, read_tasks

INSTANCE_TYPE = "g6.xlarge"
GOAL_P95, GOAL_USD = 1.2, 0.1


def schedule_entries(per_hour: list[int]) -> list[ScheduleEntry]:
    """One calque_pool_schedule entry per hour of the week with warmth: in service from ten minutes before
    the hour until the next hour's window starts (an hour-0 window has no lead: a window with a weekday
    may not start on the day before)."""
    out = []
    for h, n in enumerate(per_hour):
        if n:
            lead = 0 if h % 24 == 0 else 10
            out.append(
                ScheduleEntry(
                    name=f"how-d{h // 24}h{h % 24:02d}",
                    at=f"0 {h % 24} * * {h // 24}",
                    duration=f"{49 if h % 24 < 23 else 59}m",
                    instances=n,
                    lead=f"{lead}m",
                )
            )
    return out


def _row(r: Result, items: float, base: Result | None) -> str:
    p95 = pct(r.ttfr, 0.95)
    usd_item = r.usd / items
    head = f"{r.name:<44} {r.starts:>6} {r.warm_starts:>5} {r.usd:>9.0f} {usd_item:>9.5f} {p95:>8.0f}"
    if base is None:
        return head + f" {'1.00x':>7} {'1.000x':>8}  baseline"
    p_ratio, u_ratio = p95 / pct(base.ttfr, 0.95), usd_item / (base.usd / items)
    over = [f"p95 {p_ratio / GOAL_P95:.2f}x"] if p_ratio > GOAL_P95 else []
    over += [f"$/item {u_ratio / GOAL_USD:.1f}x"] if u_ratio > GOAL_USD else []
    verdict = "meets the goal" if not over else "misses: " + " and ".join(over) + " its bound"
    return head + f" {p_ratio:>6.2f}x {u_ratio:>7.3f}x  {verdict}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replay.pools", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, required=True, help="alibaba cluster-trace-gpu-v2023 pods CSV")
    ap.add_argument("--start-day", type=float, default=115.0, help="the pool's first day (weeks count from it)")
    ap.add_argument("--history-weeks", type=int, default=2, help="weeks before the first scored week")
    ap.add_argument("--latency-s", type=float, default=600.0, help="the pool's latency ask (the backlog target)")
    ap.add_argument("--first-result-s", type=float, default=6.0, help="a claim's first result after this much work")
    ap.add_argument("--fit-quantile", type=float, default=1.0, help="of an hour's peak over earlier weeks")
    ap.add_argument("--fit-headroom", type=int, default=1, help="instances added to a fitted hour with demand")
    ap.add_argument("--scaledown-window", type=int, default=None, help="the script's Modal knob (Modal: 60 s)")
    ap.add_argument(
        "--max-size", type=int, default=0, help="the fixed pool's size and max_containers (0: history's peak)"
    )
    ap.add_argument("--max-work-s", type=float, default=0.0, help="set aside tasks that ran longer (0: none)")
    ap.add_argument("--seed", type=int, default=1, help="AWS's random tie-break among equal instances")
    a = ap.parse_args(argv)
    if a.history_weeks < 1 or not 0 <= a.fit_quantile <= 1:
        ap.error("--history-weeks must be at least 1 and --fit-quantile in [0, 1]")
    try:
        tasks = read_tasks(a.trace)
    except TraceError as exc:
        print(f"bench.replay.pools: {exc}", file=sys.stderr)
        return 2
    t0 = a.start_day * DAY
    s0 = t0 + a.history_weeks * WEEK
    s1 = max(t.deleted for t in tasks if t.deleted is not None)
    if s1 <= s0:
        ap.error("no held-out weeks: start earlier or use fewer --history-weeks")
    claims, aside = claims_of(tasks, t0, s1, a.max_work_s)
    known = [c for c in claims if c.arrival + c.work < s0]  # finished before the held-out weeks
    spc = statistics.median(c.work for c in known)
    size = a.max_size or max(demand_by_hour(claims, t0, s0).values())
    knobs = ModalKnobs(target="Trace", max_containers=size, scaledown_window=a.scaledown_window)
    pool_defaults = resolve(PoolKnobsRequest(script="trace.py"), knobs)
    settings = ScalingSettings(seconds_per_claim=spc, latency_s=a.latency_s, idle_s=pool_defaults.idle_s.value or 900)
    policy = Policy.of(settings)
    max_size = pool_defaults.max_size.value or size
    row = rate(INSTANCE_TYPE)
    modal_usd_s = modal_usd_per_gpu_second(row.gpu) or 0.0
    scored = [c for c in claims if s0 <= c.arrival < s1]
    work_s = sum(min(c.work, s1 - c.arrival) for c in scored)
    items = work_s / a.first_result_s

    def weekly(week_start: float) -> Actions:
        fit = fit_hour_of_week(claims, t0, week_start, a.fit_quantile, a.fit_headroom, max_size)
        return recurring_actions(schedule_entries(fit), pool_defaults.min_size.value or 0)

    print(f"trace: {a.trace} ({len(tasks)} tasks); pool demand: whole-GPU tasks, one claim per GPU")
    print(
        f"  window: trace days {a.start_day:g} to {s1 / DAY:.2f}; history (fit only) days {a.start_day:g} to "
        f"{s0 / DAY:g}; held-out (scored) days {s0 / DAY:g} to {s1 / DAY:.2f}, each week's schedule fitted on "
        "the weeks before it"
    )
    print(
        f"  claims: {len(claims)} ({len(scored)} arriving in held-out weeks, {work_s / 3600:.0f} GPU-h of work); "
        "set aside: " + ", ".join(f"{k} {v}" for k, v in sorted(aside.items()))
    )
    print(
        f"  time to first result = wait for a worker + its start + min(run time, {a.first_result_s:g} s); "
        f"an item = {a.first_result_s:g} s of one GPU's work"
    )
    print(
        f"  from history: seconds per claim {spc:.0f} (median run time of claims finished before day {s0 / DAY:g}); "
        f"peak claims in progress {max(demand_by_hour(claims, t0, s0).values())}; the fixed pool's size and "
        f"max_containers {size}" + (" (--max-size)" if a.max_size else " (that peak)")
    )
    print(
        f"  calque: backlog target {policy.target:g} (ScalingSettings, latency {a.latency_s:g} s); idle alarm "
        f"{policy.idle_periods} periods; wake/idle step capacity {policy.wake_capacity}/{policy.idle_capacity} "
        "(desired_scaling's documents)"
    )
    print(
        "  knobs (calque.ops.pool_knobs.resolve): "
        + ", ".join(
            f"{k} {getattr(pool_defaults, k).value} ({getattr(pool_defaults, k).source})"
            for k in ("min_size", "max_size", "buffer", "idle_s")
        )
    )
    print(
        f"  warm pool: WarmPoolSettings() defaults (Stopped, min_size 1, max_prepared = max_size); schedule: "
        f"hour-of-week peak, quantile {a.fit_quantile:g} over earlier weeks, + {a.fit_headroom}"
    )
    print(
        f"  prices: EC2 {INSTANCE_TYPE} ({row.gpu}) ${row.usd_per_hour}/h on-demand, as of {row.as_of}; "
        f"Modal {row.gpu} ${modal_usd_s}/s (calque/data/modal-gpu-prices.yaml)"
    )
    for k, f in FIGURES.items():
        print(f"  {k}: fast {f.fast:g}, slow {f.slow:g} - {f.source}")
    for k, v in AWS_DOCS.items():
        print(f"  {k}: {v}")
    warm = WarmPoolSettings()
    oracle = work_s / 3600 * row.usd_per_hour
    for end in ends():
        started = time.monotonic()
        results = _rows(a, end, claims, t0, s0, s1, row.usd_per_hour, modal_usd_s, max_size, policy, warm, weekly)
        base = results[0]
        print()
        print(
            f"{end.name} end: boot {end.boot_s:g} s + bootstrap {end.bootstrap_s:g} s + @enter {end.enter_s:g} s "
            f"cold; warm start {end.warm_start_s:g} s + @enter {end.warm_enter_s:g} s; Modal start "
            f"{end.modal_start_s:g} s, snapshot {end.snapshot_speedup:g}x; metric lag {end.metric_lag_s:g} s "
            f"({time.monotonic() - started:.0f} s to run)"
        )
        head = f"{'row':<44} {'starts':>6} {'warm':>5} {'$ held':>9} {'$/item':>9} {'p95 s':>8}"
        head += f" {'p95 vs':>7} {'$ vs':>8}"
        print(head)
        print("-" * (len(head) + 2))
        for r in results:
            print(_row(r, items, None if r is base else base))
    print()
    print(
        f"goal: p95 <= {GOAL_P95}x the always-on pool's at <= {GOAL_USD}x its $/item on held-out weeks. The least "
        f"any pool can pay is the work itself: {oracle / base.usd:.3f}x the always-on pool's $ (its {size} GPUs "
        f"busy {100 * oracle / base.usd:.0f} % of the held-out time)"
    )
    return 0


def _rows(
    a: argparse.Namespace,
    end: Ends,
    claims: list[Claim],
    t0: float,
    s0: float,
    s1: float,
    usd_h: float,
    modal_usd_s: float,
    size: int,
    policy: Policy,
    warm: WarmPoolSettings,
    weekly: Callable[[float], Actions],
) -> list[Result]:
    groups = [
        Group(f"(a) always-on fixed pool of {size}", None, size),
        Group("(b) calque from zero, cold", policy, size),
        Group("(c) (b) + warm pool (Stopped)", policy, size, warm=warm),
        Group("(d) (c) + hour-of-week schedule from history", policy, size, warm=warm, schedule=weekly),
    ]
    out = [run(g, claims, end, t0, s0, s1, usd_h, a.first_result_s, a.seed) for g in groups]
    window = float(a.scaledown_window if a.scaledown_window is not None else 60)
    for snap in (False, True):
        name = f"(e) Modal, scaledown {window:g} s" + (", memory snapshot" if snap else "")
        out.append(run_modal(name, claims, end, s0, s1, modal_usd_s, a.first_result_s, window, size, snap))
    return out


if __name__ == "__main__":
    sys.exit(main())
