"""The spawner's form and what it accepts from it (issue 36): pure functions of the institution's view."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

pytest.importorskip("jupyterhub")
from calque.jupyterhub.announce import session_notices
from calque.jupyterhub.slices import Offer, Offers, hub_env
from calque.jupyterhub.spawner import amount, choice_from_form, form_html
from calque.ledger.budgets import budget_left, budget_state, when_spent
from calque.models.broker import LabStanding
from calque.models.institution import Lab

NOON = datetime(2026, 12, 7, 12, 5, tzinfo=timezone.utc)


def _standing(lab: Lab, gpu_hours: float, usd: float = 0.0, extra: float = 0.0) -> LabStanding:
    """What the broker answers for a member of ``lab`` that used ``gpu_hours`` this month (its own rule)."""
    spend = budget_state(lab, gpu_hours, usd, NOON, extra)
    if lab.budget is None:
        return LabStanding(lab=lab.name)
    return LabStanding(lab=lab.name, spend=spend, left=budget_left(spend), when_spent=when_spent(spend), as_of=NOON)


def test_the_form_shows_free_counts_the_next_to_free_and_the_lab() -> None:
    nine = datetime(2026, 12, 7, 9, 30, tzinfo=timezone.utc)
    offers = Offers(
        [Offer("1g.24gb", 0, 4, nine), Offer("3g.71gb", 1, 2), Offer("mps", 2, 4)], 1, LabStanding(lab="physics")
    )
    page = form_html(offers, {"profile": "3g.71gb"}, "4h", "8h")
    assert "none free: you will wait in the queue; next frees at 09:30 UTC" in page
    assert '<option value="3g.71gb" selected>3g.71gb: 1 of 2 free</option>' in page
    assert "MPS slot (shared GPU, no isolation): 2 of 4 free" in page
    assert "<b>physics</b>" in page and "1 request(s) waiting" in page and "at most 8h" in page
    assert "Billed to lab <b>physics</b>, which has no budget: its use is not capped." in page


def test_the_form_shows_her_labs_budget_left_and_what_happens_when_it_is_spent_escaped() -> None:
    lab = Lab.model_validate(
        {"name": "bio<x>", "groups": ["bio"], "budget": {"gpu_hours": 100, "raised_by": "Ada <rc@example.edu>"}}
    )
    page = form_html(Offers([Offer("1g.24gb", 1, 4)], 0, _standing(lab, 37.5, extra=10)), {}, "4h", "8h")
    assert "Billed to lab <b>bio&lt;x&gt;</b>: 72.50 of its 100.00 + 10.00 GPU-hours budget left for 2026-12" in page
    assert "(34% used, as of 12:05 UTC)" in page
    assert "When it is spent, new checkouts by its members are refused until next month or until " in page
    assert "Ada &lt;rc@example.edu&gt; raises it" in page and "<x>" not in page and "<rc@" not in page
    assert 'class="alert' not in page  # far from its end: no alert

    small = Lab.model_validate({"name": "p", "groups": ["p"], "budget": {"usd": 5, "notify_at": 0.5}})
    page = form_html(Offers([Offer("mps", 1, 1)], 0, _standing(small, 1, usd=4.9965)), {}, "4h", "8h")
    assert '<p class="alert alert-warning" id="calque-lab">Billed to lab <b>p</b>: 0.0035 of its 5.00 USD' in page


def test_a_lab_that_spent_its_budget_is_told_so_before_she_asks() -> None:
    lab = Lab.model_validate({"name": "chem", "groups": ["chem"], "budget": {"gpu_hours": 2}})
    page = form_html(Offers([Offer("1g.24gb", 1, 4)], 0, _standing(lab, 2.5)), {}, "4h", "8h")
    assert '<p class="alert alert-danger" id="calque-lab">Lab <b>chem</b> has spent its 2.00 GPU-hours budget' in page
    assert "for 2026-12 (125% used, as of 12:05 UTC): new checkouts by its members are refused" in page


def test_a_user_in_no_lab_is_told_no_budget_applies() -> None:
    page = form_html(Offers([Offer("1g.24gb", 1, 4)], 0, LabStanding()), {}, "4h", "8h")
    assert "You are in none of the institution's labs: no lab budget applies." in page


def test_a_missing_view_still_lets_her_ask_and_says_why() -> None:
    page = form_html(Offers(unknown="cannot reach the broker <x>"), {}, "4h", "8h")
    assert "cannot reach the broker &lt;x&gt;" in page and 'name="profile"' in page


def test_the_form_bounds_the_length_by_the_hubs_maximum() -> None:
    assert choice_from_form({"profile": ["1g.24gb"], "ttl": ["2h"]}, "4h", "8h") == {"profile": "1g.24gb", "ttl": "2h"}
    assert choice_from_form({}, "4h", "8h") == {"profile": None, "ttl": "4h"}
    with pytest.raises(ValueError, match="at most 8h"):
        choice_from_form({"ttl": ["9h"]}, "4h", "8h")
    with pytest.raises(ValueError):
        choice_from_form({"ttl": ["soon"]}, "4h", "8h")


def test_only_the_hubs_variables_go_to_the_host() -> None:
    env = {"JUPYTERHUB_API_TOKEN": "t", "JPY_API_TOKEN": "t", "PATH": "/x", "LD_PRELOAD": "/y", "LANG": "C"}
    assert hub_env(env) == {"JUPYTERHUB_API_TOKEN": "t", "JPY_API_TOKEN": "t"}


def test_a_budgets_figure_is_readable_at_any_size() -> None:
    shown = [amount(x) for x in (1234.5, 1.0, 0.0, 0.5, 0.0035, 0.00960123, 0.0000004)]
    assert shown == ["1,234.50", "1.00", "0.00", "0.5", "0.0035", "0.0096", "0"]


def test_the_hubs_home_page_says_what_her_spawner_knows_escaped() -> None:
    ending = SimpleNamespace(
        notice="session s-1 on <gpu7> ends at 14:05 UTC (its time is up): extend", session_id="s-1"
    )
    stopped = SimpleNamespace(notice=None, last_end="session s-0 on gpu7 expired (its time was up)", session_id=None)
    other = SimpleNamespace()  # a spawner that is not calque's says nothing
    page = session_notices(SimpleNamespace(spawners={"": ending, "b": stopped, "c": other}))
    assert page == (
        '<span id="calque-notice">Your notebook: session s-1 on &lt;gpu7&gt; ends at 14:05 UTC (its time is up): '
        "extend.<br>Your last server stopped: session s-0 on gpu7 expired (its time was up).</span>"
    )
    assert session_notices(None) == "" and session_notices(SimpleNamespace(spawners={"": other})) == ""
