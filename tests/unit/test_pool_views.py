"""The views ``calque pool status`` prints from are held to the models they mirror.

``calque.models.pool_views`` reads the queue's depth, the workers' load records and the group without
pydantic (start-up); these tests make sure it reads exactly what the models define: the same field
names and defaults, the same values for every record a worker writes, the same refusals, and the same
JSON once ``--json`` turns the views into the models.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from calque.aws.acquire.group_status import GroupReading, GroupView, scaling_status
from calque.aws.acquire.scaling import ScalingStatus
from calque.models import LoadRecord, QueueDepth
from calque.models.pool_names import pool_names
from calque.models.pool_views import DepthView, LoadView, ScalingStatusView, load_view
from calque.models.view_reader import ViewError
from calque.pool.submitter.load_reads import load_error_message, split_health
from calque.pool.submitter.loads import health, load_error
from calque.pool.submitter.status import PoolView
from pydantic import ValidationError
from support.views import assert_same_fields_and_defaults

PAIRS = [(DepthView, QueueDepth), (LoadView, LoadRecord), (ScalingStatusView, ScalingStatus)]
NOW = datetime(2026, 12, 2, 7, 0, 0, 123456, tzinfo=timezone.utc)


@pytest.mark.parametrize(("view", "model"), PAIRS, ids=lambda c: c.__name__)
def test_a_view_has_its_models_fields_and_defaults(view: type, model: type) -> None:
    assert_same_fields_and_defaults(view, model)


def _records() -> list[LoadRecord]:
    serving = LoadRecord(
        slot="gpu-a/0", worker_id="gpu-a:41/0", state="serving", workload="embed.py::Model", methods=["embed", "up"],
        default_method="embed", workload_digest="sha256:ab", enter_seconds=3.5, at=NOW, seen_at=NOW,
    )  # fmt: skip
    failed = LoadRecord(
        slot="gpu-b/1", worker_id="gpu-b:7/1", state="failed", workload="embed.py::Model",
        error="RuntimeError: weights not found", traceback="Traceback\n  line\nRuntimeError: weights not found",
        failures=3, retry_in_s=12.5, at=NOW - timedelta(seconds=30), seen_at=NOW - timedelta(seconds=30),
    )  # fmt: skip
    stopped = LoadRecord(
        slot="gpu-c/0", worker_id="gpu-c:9/0", state="stopped", workload="w.py::M", at=NOW, seen_at=NOW
    )
    return [serving, failed, stopped]


def test_every_record_a_worker_writes_reads_as_the_model_reads_it() -> None:
    for record in _records():
        view = load_view(record.model_dump_json().encode())
        assert dataclasses.asdict(view) == record.model_dump(), record.state


def test_the_health_rule_and_the_load_error_are_the_same_for_views_and_records() -> None:
    records = _records()[1:]  # no serving worker: the failure counts
    views = [load_view(r.model_dump_json().encode()) for r in records]
    served, failing = split_health(views, NOW)
    assert served == [] and failing is not None and failing.slot == "gpu-b/1"
    assert health(records, NOW).failing == records[0]
    said = load_error_message(failing, "m")
    assert said == str(load_error(records[0], "m"))
    assert "(3 times in a row; it retries in 12.5s): RuntimeError: weights not found" in said
    assert split_health([load_view(_records()[0].model_dump_json().encode()), *views], NOW)[1] is None


def _bad_records() -> list[tuple[dict[str, Any], str, bool]]:
    good = json.loads(_records()[1].model_dump_json())
    return [
        ({**good, "slots": "x"}, "unknown field", True),
        ({k: v for k, v in good.items() if k != "worker_id"}, "worker_id: missing", True),
        ({**good, "state": "loading"}, "state: not one of serving, failed, stopped", True),
        ({**good, "slot": ""}, "must not be empty", True),
        ({**good, "failures": -1}, "must not be negative", True),
        ({**good, "retry_in_s": -0.5}, "must not be negative", True),
        ({**good, "at": "yesterday"}, "at: not an ISO 8601 time", True),
        ({**good, "methods": ["a", 1]}, "methods: not a list of strings", True),
        ({**good, "version": 2}, "LoadRecord version 2 is newer than this calque reads", True),
        # stricter than the model's lax mode, which would read these: no worker writes them
        ({**good, "failures": "3"}, "failures: not an integer", False),
        ({**good, "at": "2026-12-02T07:00:00"}, "must carry a time zone", False),
    ]


@pytest.mark.parametrize(("bad", "why", "model_refuses"), _bad_records(), ids=lambda v: str(v)[:40])
def test_a_record_the_model_would_refuse_is_refused(bad: dict[str, Any], why: str, model_refuses: bool) -> None:
    data = json.dumps(bad).encode()
    with pytest.raises(ViewError, match=why):
        load_view(data)
    if model_refuses:
        with pytest.raises(ValidationError):
            LoadRecord.model_validate_json(data)


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b"\xff\xfe", b'"serving"'])
def test_bytes_that_are_no_record_are_refused(data: bytes) -> None:
    with pytest.raises(ViewError):
        load_view(data)


def _group(in_service: int) -> GroupReading:
    names = pool_names("lab-a/embedder")
    group = GroupView(names.group, 0, 8, 2, in_service, [], [])
    return GroupReading(names, group, 4.0)


@pytest.mark.parametrize("in_service", [0, 3])
def test_json_is_what_the_models_print(in_service: int) -> None:
    """``--json`` validates the views into the models: the same document status printed before the views."""
    depth = DepthView("calque-lab-a-embedder-1", visible=5, in_flight=2, delayed=0, dlq_visible=1)
    group = scaling_status(_group(in_service), depth)
    workers = [load_view(r.model_dump_json().encode()) for r in _records()]
    doc = PoolView(depth, workers, "the error", group).document()
    model_depth = QueueDepth.model_validate(dataclasses.asdict(depth))
    expect_group = ScalingStatus(
        pool="lab-a/embedder", group_name=group.group_name, group_exists=True, min_size=0, max_size=8, desired=2,
        in_service=in_service, backlog=7, backlog_per_instance=round(7 / 3, 2) if in_service else None, target=4.0,
        queue=model_depth,
    )  # fmt: skip
    assert doc["scaling"] == expect_group.model_dump(mode="json")
    assert doc["workers"]["workers"] == [r.model_dump(mode="json") for r in _records()]
    assert doc["workers"]["load_error"] == "the error" and doc["workers"]["visible"] == 5
    assert PoolView(depth, None, None, None).document() == model_depth
