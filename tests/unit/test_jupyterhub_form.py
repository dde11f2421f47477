"""The spawner's form and what it accepts from it (issue 36): pure functions of the institution's view."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

pytest.importorskip("jupyterhub")
from calque.jupyterhub.slices import Offer, Offers, hub_env
from calque.jupyterhub.spawner import choice_from_form, form_html


def test_the_form_shows_free_counts_the_next_to_free_and_the_lab() -> None:
    nine = datetime(2026, 12, 7, 9, 30, tzinfo=timezone.utc)
    offers = Offers([Offer("1g.24gb", 0, 4, nine), Offer("3g.71gb", 1, 2), Offer("mps", 2, 4)], 1, "physics")
    page = form_html(offers, {"profile": "3g.71gb"}, "4h", "8h")
    assert "none free: you will wait in the queue; next frees at 09:30 UTC" in page
    assert '<option value="3g.71gb" selected>3g.71gb: 1 of 2 free</option>' in page
    assert "MPS slot (shared GPU, no isolation): 2 of 4 free" in page
    assert "<b>physics</b>" in page and "1 request(s) waiting" in page and "at most 8h" in page


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
