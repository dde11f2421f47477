"""bench/replay's figures on hand-made outcomes (a benchmark whose arithmetic is wrong misleads)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.replay.driver import Outcome  # noqa: E402
from bench.replay.report import allocation_ratio, contended, share_deviation, waits  # noqa: E402


def _o(
    lab: str, profile: str, arrival: float, granted: float | None, released: float | None, queued_at_end: bool = False
) -> Outcome:
    return Outcome("r", lab, profile, arrival, granted, released, queued_at_end=queued_at_end)


def test_waits_contention_allocation_and_shares() -> None:
    # An institution of 14 sevenths over a 100 s window. A 7g held 0-50 by ls; a be 7g waits 10-50 then
    # holds 50-100; a be 3g arrives at 60 and is still queued at the end (censored at 100).
    outs = [
        _o("ls", "7g.40gb", 0, 0, 50),
        _o("be", "7g.40gb", 10, 50, 100),
        _o("be", "3g.20gb", 60, None, None, queued_at_end=True),
    ]
    assert contended(outs, 100) == [(10, 50), (60, 100)]
    ratio, share_of_window = allocation_ratio(outs, 100, 14)
    # While waited (80 s): 40 s with ls's 7 of 14, 40 s with be's 7 of 14.
    assert ratio == 0.5 and share_of_window == 0.8
    # Both labs waited only while ls's 3g waited (20-45, granted at 45 to 70): then be held nothing
    # until 50 and ls its 7g and its 3g.
    both = [*outs, _o("ls", "3g.20gb", 20, 45, 70)]
    assert share_deviation(both, 100, {"ls": 1, "be": 3}) == {"ls": (100.0, 25.0), "be": (0.0, 75.0)}
    f = waits(outs, 100, compression=60)  # minutes of trace: replay seconds x 60 / 60
    assert (f.n, f.granted, f.queued_at_end, f.errors) == (3, 2, 1, 0)
    assert (f.p50, f.p99) == (40.0, 40.0) and waits(outs[:2], 100, 60).p50 == 0.0
