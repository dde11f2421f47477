"""``calque gpu mig suggest`` benchmark: a layout suggested from earlier weeks of a host's demand, scored
on later weeks it never saw, against the layout it replaced.

On the trace (the default; ``--trace PATH``): the Alibaba GPU trace's fractional-GPU tasks, as
``bench/replay/mig_weeks.py`` says (every rule printed at the top). ``--synthetic``: the older
synthetic fortnights below (its first output line says so).

Synthetic: a synthetic fortnight recorded on the current layout,
the suggestion made from it, and the next fortnight run on the current layout and on the suggested one.

The host (the teaching host of the tests): two H100 80GB, GPU 0 cut into 7 x 1g.10gb, GPU 1 into
2 x 3g.40gb. The demand, stated (synthetic: no real registry is replayed): asks arrive as Poisson
streams on weekdays from 09:00 to 18:00, ``one_g_per_h`` (3.5) for a 1g.10gb and ``three_g_per_h``
(0.2) for a 3g.40gb, a quarter of that from 10:00 to 16:00 at the weekend; sessions last a
log-normal time (median ``one_g_median_min`` 90 and ``three_g_median_min`` 180 min, sigma 0.6, at
most 4 h). An ask that finds every slice of its profile held is refused (exit 5); ``wait_share`` (0.5)
of those wait (``checkout --wait``) up to ``max_wait_min`` (30 min) for one to free, first come first
served, and are granted then; the rest are lost.

Per seed: fortnight A on the current layout becomes a History (sessions, refusals, the session a
waited refusal got: what the registry records) and ``calque.gpu.suggest.suggest`` proposes a layout
from it; fortnight B, a fresh draw of the same demand, then runs on both layouts. Reported: asks
refused at their first try and asks lost (refused and never granted), on the current layout and on the
suggested one, with suggested / current as a ratio; the replay's own prediction on A; the time
``suggest`` takes. Medians over ``seeds``.

Run: .venv/bin/python bench/mig_suggest.py --trace ../shared/data/traces/alibaba-gpu-v2023-pods.csv
     .venv/bin/python bench/mig_suggest.py --synthetic [--seeds 5] [--one-g-per-h 3.5] [--three-g-per-h 0.4] ...
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench.replay importable

from calque.gpu.planner import current_layout
from calque.gpu.sim import SimGpu
from calque.gpu.suggest import suggest
from calque.models.mig_history import History, Refusal, Use

DAY = 86400.0
FORTNIGHT = 14 * DAY


def arrivals(rng: random.Random, per_h: float, median_min: float) -> list[tuple[float, float]]:
    """(start, duration) of one profile's asks over a fortnight that starts on a Monday at 00:00."""
    out = []
    for day in range(14):
        weekend = day % 7 >= 5
        lo, hi, rate = (10, 16, per_h / 4) if weekend else (9, 18, per_h)
        t = day * DAY + lo * 3600
        while rate > 0:
            t += rng.expovariate(rate) * 3600
            if t >= day * DAY + hi * 3600:
                break
            dur = min(4 * 3600.0, median_min * 60 * math.exp(rng.gauss(0, 0.6)))
            out.append((t, dur))
    return out


def run_profile(
    asks: list[tuple[float, float]], n: int, waits: list[bool], max_wait: float, profile: str, tag: str
) -> tuple[list[Use], list[Refusal]]:
    """One profile's fortnight on ``n`` slices: the sessions and refusals its registry would hold."""
    uses: list[Use] = []
    refusals: list[Refusal] = []
    running: list[float] = []
    queue: list[tuple[float, float, float, int]] = []  # (refused at, deadline, duration, ask index) FIFO
    seq = 0

    def grant(at: float, dur: float) -> str:
        nonlocal seq
        seq += 1
        sid = f"{tag}-{profile}-{seq}"
        uses.append(Use(sid, profile, 0, at, at + dur))
        heapq.heappush(running, at + dur)
        return sid

    def free_until(t: float) -> None:
        """Slices free up to ``t``; each goes to the first waiting ask still waiting."""
        while running and running[0] <= t:
            end = heapq.heappop(running)
            while queue and queue[0][1] < end:  # gave up before this slice freed: lost
                r_at, deadline, _, _ = queue.pop(0)
                refusals.append(Refusal(profile, r_at, deadline, 2))
            if queue:
                r_at, _, dur, _ = queue.pop(0)
                refusals.append(Refusal(profile, r_at, end, 2, grant(end, dur)))

    for i, (at, dur) in enumerate(asks):
        free_until(at)
        if len(running) < n:
            grant(at, dur)
        elif waits[i]:
            queue.append((at, at + max_wait, dur, i))
        else:
            refusals.append(Refusal(profile, at, at, 1))
    free_until(math.inf)
    refusals += [Refusal(profile, r_at, deadline, 2) for r_at, deadline, _, _ in queue]
    return uses, refusals


def fortnight(
    rng: random.Random, layout: Counter[str], a: argparse.Namespace, tag: str
) -> tuple[list[Use], list[Refusal]]:
    uses: list[Use] = []
    refusals: list[Refusal] = []
    for profile, per_h, median_min in (
        ("1g.10gb", a.one_g_per_h, a.one_g_median_min),
        ("3g.40gb", a.three_g_per_h, a.three_g_median_min),
    ):
        asks = arrivals(rng, per_h, median_min)
        waits = [rng.random() < a.wait_share for _ in asks]
        u, r = run_profile(asks, layout[profile], waits, a.max_wait_min * 60, profile, tag)
        uses += u
        refusals += r
    return uses, refusals


def outcome(refusals: list[Refusal]) -> tuple[int, int]:
    """(asks refused at their first try, asks lost: refused and never granted)."""
    return len(refusals), sum(1 for r in refusals if r.granted is None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, help="alibaba cluster-trace-gpu-v2023 pods CSV (the default mode)")
    p.add_argument("--synthetic", action="store_true", help="the synthetic fortnights instead of the trace")
    p.add_argument("--hosts", type=int, default=2, help="trace: the host gets every N-th fractional task")
    p.add_argument("--fit-from-day", type=float, default=112.0, help="trace: the history's first day")
    p.add_argument("--history-weeks", type=int, default=2, help="trace: weeks the suggestion is fitted on")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--one-g-per-h", type=float, default=3.5)
    p.add_argument("--three-g-per-h", type=float, default=0.2)
    p.add_argument("--one-g-median-min", type=float, default=90)
    p.add_argument("--three-g-median-min", type=float, default=180)
    p.add_argument("--wait-share", type=float, default=0.5)
    p.add_argument("--max-wait-min", type=float, default=30)
    a = p.parse_args()
    if not a.synthetic:
        from bench.replay.mig_bench import on_trace

        if a.trace is None:
            p.error("--trace PATH (the Alibaba GPU trace), or --synthetic for the synthetic fortnights")
        raise SystemExit(on_trace(a))
    print("SYNTHETIC demand (--synthetic): invented Poisson fortnights, not the trace")
    with tempfile.TemporaryDirectory() as d:
        sim = SimGpu.create(Path(d) / "gpus.json", ["H100-80GB", "H100-80GB"])
        sim.enable_mig()
        sim.create_instances(0, ["1g.10gb"] * 7)
        sim.create_instances(1, ["3g.40gb"] * 2)
        state = current_layout(sim)
    current = Counter({"1g.10gb": 7, "3g.40gb": 2})
    rows: dict[str, list[float]] = {}
    layouts: Counter[str] = Counter()
    for seed in range(a.seeds):
        rng = random.Random(seed)
        uses, refusals = fortnight(rng, current, a, "A")
        history = History("synthetic fortnight A", 0.0, FORTNIGHT, 0.0, uses=uses, refusals=refusals)
        t0 = time.perf_counter()
        s = suggest(state, history, "teaching")
        rows.setdefault("suggest_ms", []).append((time.perf_counter() - t0) * 1000)
        suggested = sum((Counter(g.after) for g in s.gpus), Counter[str]())
        layouts[" + ".join(f"{n}x {p}" for p, n in sorted(suggested.items()))] += 1
        rows.setdefault("replay_now", []).append(sum(x.replayed_refusals_now for x in s.profiles))
        rows.setdefault("replay_suggested", []).append(sum(x.replayed_refusals_suggested for x in s.profiles))
        for name, layout in (("current", current), ("suggested", suggested)):
            refused, lost = outcome(fortnight(random.Random(1000 + seed), layout, a, "B")[1])
            rows.setdefault(f"refused_{name}", []).append(refused)
            rows.setdefault(f"lost_{name}", []).append(lost)
    med = {k: statistics.median(v) for k, v in rows.items()}

    def ratio(x: float, y: float) -> str:
        return f"{x / y:.3f}" if y else "-"

    print(f"demand: 1g.10gb {a.one_g_per_h}/h (median {a.one_g_median_min:g} min), 3g.40gb {a.three_g_per_h}/h")
    print(f"(median {a.three_g_median_min:g} min), weekdays 09-18; {a.wait_share:.0%} of refused asks wait up to")
    print(f"{a.max_wait_min:g} min; medians over {a.seeds} seeds")
    print(
        "current layout: 7x 1g.10gb + 2x 3g.40gb; suggested (seeds): "
        + "; ".join(f"{k} ({n})" for k, n in layouts.items())
    )
    print(f"{'figure':44} {'current':>9} {'suggested':>10} {'ratio':>7}")
    for label, key in (
        ("fortnight B: asks refused at first try", "refused"),
        ("fortnight B: asks lost (never granted)", "lost"),
    ):
        c, s_ = med[f"{key}_current"], med[f"{key}_suggested"]
        print(f"{label:44} {c:>9g} {s_:>10g} {ratio(s_, c):>7}")
    c, s_ = med["replay_now"], med["replay_suggested"]
    print(f"{'fortnight A replayed (the suggestion says)':44} {c:>9g} {s_:>10g} {ratio(s_, c):>7}")
    print(f"suggest() on a fortnight's history: {med['suggest_ms']:.1f} ms")


if __name__ == "__main__":
    main()
