"""Shared models: JSON round trips, unknown fields refused, invariants enforced."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from calque.models import ClaimRef, Item, ItemError, ItemResult, Manifest, PoolSpec, QueueSettings, Summary
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)


def claim(**kw: object) -> ClaimRef:
    base: dict[str, object] = dict(
        run_id="r1",
        claim_id="c0001",
        model="m",
        method="embed",
        manifest_uri="s3://b/calque/runs/r1/claims/c0001/manifest.json",
        results_prefix="s3://b/calque/runs/r1/",
        item_count=3,
        submitted_at=NOW,
    )
    base.update(kw)
    return ClaimRef.model_validate(base)


def test_claimref_round_trips_through_json() -> None:
    ref = claim(workload_digest="abc")
    assert ClaimRef.model_validate_json(ref.model_dump_json()) == ref


@given(st.lists(json_values, max_size=5), st.dictionaries(st.text(max_size=8), json_values, max_size=4))
def test_manifest_round_trips_any_json_items(args: list[object], kwargs: dict[str, object]) -> None:
    m = Manifest(run_id="r", claim_id="c", model="m", method="f", items=[Item(index=0, args=args, kwargs=kwargs)])
    assert Manifest.model_validate_json(m.model_dump_json()) == m


def test_unknown_fields_are_refused_everywhere() -> None:
    with pytest.raises(ValidationError, match="Extra inputs"):
        claim(surprise=1)
    with pytest.raises(ValidationError, match="Extra inputs"):
        QueueSettings.model_validate({"visibility_timeout": 30, "visiblity": 1})


def test_manifest_rejects_duplicate_item_indices() -> None:
    with pytest.raises(ValidationError, match="unique"):
        Manifest(run_id="r", claim_id="c", model="m", method="f", items=[Item(index=1), Item(index=1)])


def test_item_result_is_ok_xor_error() -> None:
    ItemResult(index=0, ok=True, value=[1, 2], seconds=0.1)
    ItemResult(index=0, ok=False, error=ItemError(type="ValueError", message="bad"), seconds=0.1)
    with pytest.raises(ValidationError, match="must carry an error"):
        ItemResult(index=0, ok=False, seconds=0.1)
    with pytest.raises(ValidationError, match="carries no error"):
        ItemResult(index=0, ok=True, error=ItemError(type="E", message="m"), seconds=0.1)


def test_summary_round_trips() -> None:
    s = Summary(
        run_id="r",
        claim_id="c",
        model="m",
        method="f",
        ok=True,
        items=10,
        failed=1,
        warm_hit=True,
        enter_seconds_paid=0.0,
        enter_count=1,
        attempt=1,
        worker_id="w1",
        started_at=NOW,
        finished_at=NOW,
        claim_seconds=1.5,
        method_seconds=1.2,
    )
    assert Summary.model_validate_json(s.model_dump_json()) == s


def test_queue_settings_bounds_say_what_to_change() -> None:
    with pytest.raises(ValidationError, match="less than or equal to 43200"):
        QueueSettings(visibility_timeout=50_000)
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        QueueSettings(max_receive_count=0)


def test_pool_spec_needs_one_device_entry_per_worker() -> None:
    PoolSpec(model="m", workload="s.py", bucket="bkt", workers=2, cuda_visible_devices=["0", "1"])
    with pytest.raises(ValidationError, match="one entry per worker"):
        PoolSpec(model="m", workload="s.py", bucket="bkt", workers=2, cuda_visible_devices=["0"])
