"""What a pool's workers say about loading their workload, and a pool's status as a user reads it.

A worker writes one ``LoadRecord`` per slot (host and worker index) under the pool's prefix when
its load ends, serving or failed, refreshes it while it serves and marks it stopped when it exits.
Submitters read them to fail fast when no worker can load, and to refuse a method the class lacks.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from calque.models.base import VersionedModel
from calque.models.pool import SCHEMA_VERSION, QueueDepth


class LoadRecord(VersionedModel):
    """One worker slot's last load: ``<prefix>/pools/<queue>/load/<slot>.json``."""

    upgrade_hint: ClassVar[str] = "upgrade calque where the pool is read (calque pool submit/status, calque run)"
    version: int = SCHEMA_VERSION
    slot: str = Field(min_length=1, description="host and worker index: a restarted worker rewrites its own record")
    worker_id: str = Field(min_length=1, description="host:pid[/index] of the process that wrote it")
    state: Literal["serving", "failed", "stopped"]
    workload: str
    workload_digest: str | None = None
    methods: list[str] = Field(default_factory=list, description="the class's methods (serving only)")
    default_method: str | None = None
    error: str | None = Field(None, description="failed: the exception's type and message, one line")
    traceback: str | None = None
    failures: int = Field(0, ge=0, description="consecutive load failures of this slot")
    retry_in_s: float = Field(0.0, ge=0, description="failed: how long the worker holds before it exits (backoff)")
    enter_seconds: float | None = Field(None, ge=0)
    at: datetime = Field(description="when this state began")
    seen_at: datetime = Field(description="the worker's last refresh (serving: every minute)")


class PoolStatus(QueueDepth):
    """``calque pool status``: the queue's depth and, when the bucket is known, every worker slot's load record."""

    workers: list[LoadRecord] = Field(default_factory=list)
    load_error: str | None = Field(None, description="set when no worker serves and a recent load failed")
