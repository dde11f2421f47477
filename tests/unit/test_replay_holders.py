"""bench/replay's holder model and idle-reclaim figures on hand-made outcomes and audit lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.replay.driver import Outcome  # noqa: E402
from bench.replay.holders import booked_s, read_ends  # noqa: E402
from bench.replay.report import reclaim_figures  # noqa: E402


def test_a_booked_holder_asks_whole_hours_and_a_prompt_one_its_run_time() -> None:
    assert booked_s(1, "booked") == 3600 and booked_s(3600, "booked") == 3600 and booked_s(3601, "booked") == 7200
    assert booked_s(0, "booked") == 3600  # a task that ran no time still booked an hour
    assert booked_s(655, "prompt") == 655
    with pytest.raises(ValueError, match="booked, prompt"):
        booked_s(1, "lazy")


def test_each_sessions_first_end_is_read_and_garbage_skipped(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    lines = [
        {"event": "checkout", "session": "a", "ts": "2026-12-07T10:00:00+00:00"},
        {"event": "idle", "session": "a", "ts": "2026-12-07T10:00:05+00:00"},
        {"event": "checkin", "session": "a", "ts": "2026-12-07T10:00:09+00:00"},  # later: not its end
        {"event": "expiry", "session": "b", "ts": "2026-12-07T10:00:07+00:00"},
    ]
    audit.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n{}\n")
    ends = read_ends(audit)
    assert {k: v.event for k, v in ends.items()} == {"a": "idle", "b": "expiry"}
    assert ends["b"].at - ends["a"].at == 2.0
    assert read_ends(tmp_path / "absent.jsonl") == {}


def _o(granted: float, busy: float, booked: float, released: float, ended_by: str) -> Outcome:
    return Outcome(
        "r", "be", "7g.40gb", 0.0, granted, released, busy_until=busy, booked_until=booked, ended_by=ended_by
    )


def test_reclaimed_idle_time_and_active_sessions_reclaimed() -> None:
    # A window of 100 replay s at 36x (1 replay s = 0.01 trace h). Reclaimed at 40 (busy to 20, booked to 80):
    # idle held 20 s, reclaimed 40 s. Expired at its TTL (busy to 10, booked to 30): idle held 20 s. Reclaimed at
    # 15 while busy to 25 (an active session ended): counted, idle held 0, nothing reclaimed before its work ended.
    outs = [_o(0, 20, 80, 40, "idle"), _o(0, 10, 30, 30, "expiry"), _o(5, 25, 90, 15, "idle")]
    r = reclaim_figures(outs, 100, compression=36)
    assert (r.ended, r.active) == (2, 1)
    assert r.idle_held_h == pytest.approx(0.4) and r.idle_reclaimed_h == pytest.approx(0.4 + 0.65)
    # The window's end clips what a session would have held on to.
    assert reclaim_figures([_o(0, 20, 300, 40, "idle")], 100, 36).idle_reclaimed_h == pytest.approx(0.6)


def test_the_mapping_gives_each_request_its_booked_hold() -> None:
    from bench.replay.mapping import Window, demand
    from bench.replay.trace import Task

    task = Task("p", 1, 810, "BE", "Running", 100.0, 160.0, 160.0 + 4000)  # ran 4,000 s: booked 2 h
    w = Window(start_day=0, days=1, compression=100)
    (booked,) = demand([task], w, ("7g.40gb",), "booked").requests
    (prompt,) = demand([task], w, ("7g.40gb",), "prompt").requests
    assert (booked.hold, booked.booked) == (40.0, 72.0) and (prompt.hold, prompt.booked) == (40.0, 40.0)
