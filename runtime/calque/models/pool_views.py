"""What ``calque pool status`` prints from: pydantic-free twins of the pool's status contracts.

The contracts are ``QueueDepth`` (``calque.models.pool``), ``LoadRecord`` (``calque.models.poolload``)
and ``ScalingStatus`` (``calque.aws.acquire.scaling``). Importing pydantic and building those models was
a fifth of the command's start-up (bench/pool_status.py), so its human output reads the same documents
and answers into these frozen dataclasses, by ``calque.models.view_reader``'s rules; ``--json`` validates
them into the models and prints those. tests/unit/test_pool_views.py holds each view to its model,
field by field and value by value.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any

from calque.models.versions import POOL_SCHEMA_VERSION, check_version_number
from calque.models.view_reader import READERS, ViewError, read_view

LOAD_STATES = ("serving", "failed", "stopped")
_LOAD_RECORD_UPGRADE = "upgrade calque where the pool is read (calque pool submit/status, calque run)"


@dataclasses.dataclass(frozen=True, slots=True)
class DepthView:
    queue_name: str
    visible: int
    in_flight: int
    delayed: int
    dlq_visible: int
    oldest_message_age_s: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class LoadView:
    slot: str
    worker_id: str
    state: str
    workload: str
    at: datetime
    seen_at: datetime
    version: int = POOL_SCHEMA_VERSION
    workload_digest: str | None = None
    methods: list[str] = dataclasses.field(default_factory=list)
    default_method: str | None = None
    error: str | None = None
    traceback: str | None = None
    failures: int = 0
    retry_in_s: float = 0.0
    enter_seconds: float | None = None

    def __post_init__(self) -> None:  # LoadRecord's constraints, as its fields declare them
        if self.state not in LOAD_STATES:
            raise ViewError(f"state: not one of {', '.join(LOAD_STATES)}")
        if not self.slot or not self.worker_id:
            raise ViewError("slot and worker_id must not be empty")
        if self.failures < 0 or self.retry_in_s < 0 or (self.enter_seconds is not None and self.enter_seconds < 0):
            raise ViewError("failures, retry_in_s and enter_seconds must not be negative")
        if self.at.tzinfo is None or self.seen_at.tzinfo is None:
            raise ViewError("at and seen_at must carry a time zone")


@dataclasses.dataclass(frozen=True, slots=True)
class ScalingStatusView:
    pool: str
    group_name: str
    group_exists: bool
    backlog: int
    queue: DepthView
    min_size: int | None = None
    max_size: int | None = None
    desired: int | None = None
    in_service: int | None = None
    backlog_per_instance: float | None = None
    target: float | None = None


def _version(v: Any) -> int:
    n: int = READERS["int"](v)
    try:
        check_version_number("LoadRecord", n, POOL_SCHEMA_VERSION, _LOAD_RECORD_UPGRADE)
    except ValueError as exc:
        raise ViewError(str(exc)) from None
    return n


def load_view(data: bytes) -> LoadView:
    """A worker slot's load record from its object's bytes; ViewError for anything ``LoadRecord`` refuses."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ViewError("not JSON") from None
    if isinstance(doc, dict) and "version" in doc:
        _version(doc["version"])  # a newer record is refused before its fields are looked at, as the model does
    return read_view(LoadView, doc)
