"""The parts of ``mig suggest``: the replay of one profile's asks (hand-computed cases) and the candidate
layouts of each MIG card, every one of which the planner must accept on a simulated card."""

from __future__ import annotations

from pathlib import Path

import pytest
from calque.gpu.catalog import load_catalog
from calque.gpu.layout import LayoutEntry
from calque.gpu.planner import MigPlanner, current_layout
from calque.gpu.replay import Ask, median, peak, refused
from calque.gpu.sim import SimGpu
from calque.gpu.suggest import layouts, suggest
from calque.models.mig_history import History, Refusal, Use

H = 3600.0
DAY = 86400.0


def test_replay_counts_the_asks_a_number_of_instances_refuses_at_their_first_try() -> None:
    # three 2 h sessions from 09:00, 09:30 and 10:00, and a refused ask at 10:30 never granted (1 h)
    asks = [Ask(9 * H, 2 * H), Ask(9.5 * H, 2 * H), Ask(10 * H, 2 * H), Ask(10.5 * H, H)]
    # one instance: 09:00 runs to 11:00, the other three find it held; two: 10:00 and 10:30 do; ...
    assert [refused(asks, n) for n in range(5)] == [4, 3, 2, 1, 0]


def test_a_refused_ask_granted_later_tries_again_then_and_counts_once() -> None:
    # one instance held 09-11; an ask at 10:00 refused, granted at 11:00 for 1 h (its client waited);
    # a second ask at 11:30 finds the waited one running: refused
    asks = [Ask(9 * H, 2 * H), Ask(10 * H, H, later=(11 * H, H)), Ask(11.5 * H, H)]
    assert refused(asks, 1) == 2
    assert refused(asks, 2) == 0  # the waited ask runs 10-11 instead, so 11:30 finds a free one


def test_an_ask_starting_as_another_ends_finds_its_slice_free() -> None:
    assert refused([Ask(0, H), Ask(H, H)], 1) == 0
    assert peak([(0, H), (H, 2 * H)]) == 1 and peak([(0, 2 * H), (H, 3 * H), (1.5 * H, 1.6 * H)]) == 3
    assert median([], 5.0) == 5.0 and median([1.0, 3.0], 0) == 2.0 and median([4.0, 1.0, 9.0], 0) == 4.0


MIG_CARDS = [k for k, c in load_catalog().cards.items() if c.mig]


@pytest.mark.parametrize("card", MIG_CARDS)
def test_every_candidate_layout_of_a_card_is_one_the_planner_accepts(card: str, tmp_path: Path) -> None:
    c = load_catalog().cards[card]
    found = layouts(card, tuple(p.name for p in c.profiles))
    assert () in found and all(((p.name, 1),) in found for p in c.profiles)  # one of any profile fits
    sim = SimGpu.create(tmp_path / "gpus.json", [card])
    sim.enable_mig()
    planner = MigPlanner(sim)
    for counts in found:
        entry = LayoutEntry.model_validate({"devices": [0], "mig-enabled": True, "mig-devices": dict(counts)})
        plan = planner.plan([entry])  # raises LayoutError for a set that does not fit
        made = sorted(op.profile or "" for op in plan.gpus[0].ops if op.kind == "create_gi")
        assert made == sorted(p for p, n in counts for _ in range(n))
    # the search reaches the layouts that use every compute slice of the card
    full = [f for f in found if sum(c.profile(p).compute_slices * n for p, n in f) == c.compute_slices]
    assert full, f"{card}: no layout uses the whole card"


def _teaching(tmp_path: Path) -> SimGpu:
    sim = SimGpu.create(tmp_path / "gpus.json", ["H100-80GB", "H100-80GB"])
    sim.enable_mig()
    sim.create_instances(0, ["1g.10gb"] * 7)
    sim.create_instances(1, ["3g.40gb"] * 2)
    return sim


def test_an_ask_for_any_slice_that_got_a_3g_later_leaves_that_session_a_3g_ask(tmp_path: Path) -> None:
    sim = _teaching(tmp_path)
    # every 1g held 09-17 on one day; an ask for any slice refused at 10:00, granted a 3g at 10:00:30
    uses = [Use(f"s{i}", "1g.10gb", 0, 9 * H, 17 * H) for i in range(7)]
    uses += [Use("s-3g", "3g.40gb", 1, 10 * H + 30, 12 * H)]
    refusal = Refusal("", 10 * H, 10 * H + 30, 2, granted="s-3g")
    s = suggest(current_layout(sim), History("h", 0.0, DAY, 0.0, uses=uses, refusals=[refusal]), "t")
    prof = {p.profile: p for p in s.profiles}
    # the any-slice ask counts for the smallest profile, as a refused 1g ask; the 3g session stays a 3g one
    assert prof["1g.10gb"].refused_asks == 1 and prof["1g.10gb"].replayed_refusals_now == 1
    assert prof["3g.40gb"].peak_in_use == 1 and prof["3g.40gb"].replayed_refusals_now == 0


def test_a_window_older_than_the_records_says_from_when_refusals_are_known(tmp_path: Path) -> None:
    sim = _teaching(tmp_path)
    s = suggest(current_layout(sim), History("h", 0.0, 14 * DAY, 13 * DAY), "t")
    assert s.changed is False
    assert s.reasons[0].startswith("refusals are recorded since 1970-01-14 00:00 UTC only")
    assert (
        "no checkout of a MIG slice was refused between 1970-01-14 00:00 UTC and 1970-01-15 00:00 UTC" in s.reasons[1]
    )
