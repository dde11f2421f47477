"""The change window of a MIG layout (``calque.ops.mig_drain``): days, ranges, midnight, bad input."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from calque.errors import UsageError
from calque.ops.mig_drain import outside, parse_window

SAT_0130 = datetime(2026, 12, 5, 1, 30, tzinfo=timezone.utc)  # a Saturday
SUN_0500 = datetime(2026, 12, 6, 5, 0, tzinfo=timezone.utc)
TUE_2330 = datetime(2026, 12, 1, 23, 30, tzinfo=timezone.utc)
WED_0200 = datetime(2026, 12, 2, 2, 0, tzinfo=timezone.utc)
SAT_0200 = datetime(2026, 12, 5, 2, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("window", "inside", "out"),
    [
        ("Sat,Sun 01:00-05:00", [SAT_0130], [SUN_0500, TUE_2330]),  # the end is not inside
        ("Mon-Fri 22:00-06:00", [TUE_2330, WED_0200, SAT_0130], [SUN_0500]),  # Fri night runs into Sat
        ("Fri-Mon 22:00-06:00", [SAT_0130, SUN_0500], [TUE_2330, WED_0200]),  # a range across the week's end
        ("daily 01:00-02:00", [SAT_0130], [SAT_0200, TUE_2330]),
        ("sat 00:00-24:00", [SAT_0130, SAT_0200], [SUN_0500]),
    ],
)
def test_a_window_holds_its_times_and_no_others(window: str, inside: list[datetime], out: list[datetime]) -> None:
    w = parse_window(window)
    assert all(w.contains(t) for t in inside) and not any(w.contains(t) for t in out)


def test_outside_every_window_says_the_time_and_the_windows_and_no_window_is_any_time() -> None:
    why = outside(["Sat,Sun 01:00-05:00", "Wed 01:00-03:00"], TUE_2330)
    assert why is not None and "Tue 23:30 UTC" in why and "Sat,Sun 01:00-05:00; Wed 01:00-03:00" in why
    assert outside(["Sat,Sun 01:00-05:00", "Wed 01:00-03:00"], WED_0200) is None
    assert outside([], TUE_2330) is None


@pytest.mark.parametrize("bad", ["Sat", "Sat 1-5", "Caturday 01:00-02:00", "Sat 25:00-26:00", "Sat 02:00-02:00", ""])
def test_a_bad_window_is_a_usage_error_with_examples(bad: str) -> None:
    with pytest.raises(UsageError, match="Sat,Sun 02:00-06:00"):
        parse_window(bad)
