"""The rule submitters read a pool's load records by, and the backoff a failing worker holds for."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from calque.errors import UsageError
from calque.models import LoadRecord
from calque.models.pool_loads import FRESH_S, LIVE_S
from calque.pool.submitter.loads import PoolHealth, check_loadable, check_method, health
from calque.pool.worker.loadguard import BACKOFF_MAX_S, hold_s

NOW = datetime(2026, 12, 1, 3, 0, tzinfo=timezone.utc)


def _rec(slot: str, state: str, age_s: float, methods: list[str] | None = None) -> LoadRecord:
    at = NOW - timedelta(seconds=age_s)
    return LoadRecord(
        slot=slot, worker_id=f"{slot}:1", state=state, workload="w.py::M", methods=methods or [],  # type: ignore[arg-type]
        error="RuntimeError: boom" if state == "failed" else None, failures=1, at=at, seen_at=at,
    )  # fmt: skip


def test_a_live_serving_worker_outweighs_any_failure() -> None:
    h = health([_rec("a", "failed", 5), _rec("b", "serving", 30, ["go"])], NOW)
    assert h.failing is None and h.methods == {"go"}


def test_a_recent_failure_with_no_serving_worker_means_the_pool_cannot_load() -> None:
    h = health([_rec("a", "failed", 50), _rec("b", "failed", 10), _rec("c", "stopped", 5, ["go"])], NOW)
    assert h.failing is not None and h.failing.slot == "b" and h.methods is None
    with pytest.raises(Exception, match="RuntimeError: boom"):
        check_loadable(h, "m")


def test_stale_records_say_nothing() -> None:
    h = health([_rec("a", "failed", FRESH_S + 1), _rec("b", "serving", LIVE_S + 1, ["go"])], NOW)
    assert h == PoolHealth([], None)
    check_method(h, "anything", "call", default="__default__")  # nothing to check against: allowed


def test_a_method_the_serving_class_lacks_is_refused_and_the_default_is_not() -> None:
    h = health([_rec("b", "serving", 1, ["go", "stop"])], NOW)
    check_method(h, "go", "call", default="__default__")
    check_method(h, "__default__", "call", default="__default__")
    with pytest.raises(UsageError, match=r"methods are \['go', 'stop'\]; it has no method 'gone'"):
        check_method(h, "gone", "call", default="__default__")


def test_the_backoff_grows_from_nothing_to_its_cap() -> None:
    assert [hold_s(n) for n in range(1, 8)] == [0, 10, 20, 40, 80, 160, BACKOFF_MAX_S]
    assert hold_s(50) == BACKOFF_MAX_S
