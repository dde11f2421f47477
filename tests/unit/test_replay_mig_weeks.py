"""bench/mig_suggest.py on the trace: the fit reads only what the registry held at its day, and the
score replays asks on a layout (hand-made asks: the real trace is never needed)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.replay.mig_weeks import Ask, history, host_asks, score  # noqa: E402
from bench.replay.trace import Task  # noqa: E402

LAYOUT = Counter({"7g.40gb": 1, "3g.20gb": 1})


def test_the_fit_never_sees_a_later_ask_and_cuts_what_ran_across_its_day() -> None:
    asks = [Ask(0, 500, 800), Ask(100, 50, 800), Ask(200, 10, 300)]  # the 2nd waits 400 s for the 1st's 7g
    h = history(asks, LAYOUT, 0, 300, max_wait_s=1800)
    later = [*asks, Ask(299.0 + 1, 10_000, 800), Ask(5000, 10, 300)]
    assert history(later, LAYOUT, 0, 300, 1800) == h  # asks from the cut on change nothing
    assert sorted((u.profile, u.start, u.end) for u in h.uses) == [("3g.20gb", 200, 210), ("7g.40gb", 0, 300)]
    # At the cut the 2nd ask was still waiting: the registry did not yet know it would be granted.
    assert [(r.profile, r.first_at, r.last_at, r.granted) for r in h.refusals] == [("7g.40gb", 100, 300, None)]


def test_the_score_replays_each_ask_on_the_smallest_slice_covering_it() -> None:
    asks = [Ask(0, 500, 800), Ask(100, 50, 800), Ask(200, 10, 300), Ask(3000, 10, 900), Ask(3001, 10, 200)]
    s = score(asks, LAYOUT, 0, 4000, max_wait_s=300)  # the 2nd gives up at 400 before the 7g frees at 500
    assert (s.asks, s.refused, s.lost, s.uncovered) == (5, 1, 1, 0)
    assert s.waited_h == 300 / 3600
    two = score(asks, Counter({"7g.40gb": 2}), 0, 4000, 300)  # the 3g-sized asks take a 7g here
    assert (two.refused, two.lost) == (0, 0)
    assert score(asks, Counter({"3g.20gb": 2}), 0, 4000, 300).uncovered == 3


def test_the_host_gets_one_in_n_fractional_tasks_that_ran() -> None:
    def t(name: str, created: float, milli: int, num: int = 1, ran: bool = True) -> Task:
        return Task(name, num, milli, "BE", "Running", created, created if ran else None, created + 60 if ran else None)

    tasks = [
        t("a", 0, 500),
        t("b", 1, 500),
        t("c", 2, 1000),
        t("d", 3, 500, ran=False),
        t("e", 4, 300),
        t("f", 5, 0, 0),
    ]
    assert [x.at for x in host_asks(tasks, 2)] == [0, 4]
    assert [x.at for x in host_asks(tasks, 2, index=1)] == [1]
