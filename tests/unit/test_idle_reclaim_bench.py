"""bench/idle_reclaim.py's model checked on its own rules (a benchmark whose arithmetic is wrong misleads)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench/idle_reclaim.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("idle_reclaim_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_reclaim_rule_ends_notebooks_and_long_pauses_and_nothing_else() -> None:
    b = _bench()
    notebook = b.Request(0, [(0, 10)], 240)
    assert b.reclaim_end(notebook, 30) == (40, False)
    worker = b.Request(0, [(0, 90)], 90)
    assert b.reclaim_end(worker, 30) == (90, False)
    short_pause = b.Request(0, [(0, 45), (65, 110)], 110)
    assert b.reclaim_end(short_pause, 30) == (110, False)
    long_pause = b.Request(0, [(0, 45), (85, 130)], 130)
    assert b.reclaim_end(long_pause, 30) == (75, True)


def test_without_idle_holders_reclaim_changes_nothing_and_with_them_it_frees_slices() -> None:
    b = _bench()
    calm = b.Scenario(idle_share=0.0, pause_share=0.0, seeds=1)
    reqs = b.requests(calm, 0)
    off, on = b.simulate(calm, reqs, reclaim=False), b.simulate(calm, reqs, reclaim=True)
    assert (off.held_h, off.waits, on.reclaimed) == (on.held_h, on.waits, 0)
    busy = b.Scenario(seeds=1)
    reqs = b.requests(busy, 0)
    off, on = b.simulate(busy, reqs, reclaim=False), b.simulate(busy, reqs, reclaim=True)
    assert on.idle_held_h < off.idle_held_h and on.wait_mean() <= off.wait_mean() and on.reclaimed > 0
    assert len(off.waits) + off.waiting_at_end == len(reqs) == len(on.waits) + on.waiting_at_end
