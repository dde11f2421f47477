"""Contracts of the warm pool (Layer 1): what a pool is, what a claim points at, what a worker writes.

The queue message is a ``ClaimRef`` (a pointer, never items inline: SQS caps a message at 256 KiB);
the items live in an S3-staged ``Manifest``; the worker writes one ``ItemResult`` per item and then
one ``Summary`` per claim. See shared/seeds/pool-queue-contract.md.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from calque.models.base import BindAddress, CalqueModel, PoolName, Seconds, VersionedModel, WholeSeconds
from calque.models.ids import SafeId, check_id
from calque.models.imds_address import IMDS_ENDPOINT
from calque.models.pool_names import pool_names
from calque.models.versions import POOL_SCHEMA_VERSION

SCHEMA_VERSION = POOL_SCHEMA_VERSION  # the pool models' version (models/versions.py says when to bump it)

# SQS limits: visibility timeout at most 12 h, retention 60 s..14 days, long-poll wait 0..20 s.
# A claim that names no method runs the pool's default (the spec's ``method`` or the only one): the
# submitter writes it, the worker reads it.
DEFAULT_METHOD = "__default__"
MAX_VISIBILITY_TIMEOUT_S = 12 * 3600
MIN_RETENTION_S = 60
MAX_RETENTION_S = 14 * 24 * 3600
MAX_WAIT_S = 20


class QueueSettings(CalqueModel):
    """The tunable attributes of a pool queue and its dead-letter queue."""

    visibility_timeout: WholeSeconds = Field(
        300, ge=0, le=MAX_VISIBILITY_TIMEOUT_S, description="seconds a claim stays invisible (0..43200)"
    )
    message_retention: WholeSeconds = Field(
        4 * 24 * 3600, ge=MIN_RETENTION_S, le=MAX_RETENTION_S, description="seconds (60..1209600)"
    )
    receive_wait: WholeSeconds = Field(20, ge=0, le=MAX_WAIT_S, description="long-poll wait in seconds (0..20)")
    max_receive_count: int = Field(
        5, ge=1, le=1000, description="receives before SQS moves a message to the DLQ (1..1000)"
    )
    dlq_retention: WholeSeconds = Field(MAX_RETENTION_S, ge=MIN_RETENTION_S, le=MAX_RETENTION_S)
    encryption: bool = Field(True, description="SQS-managed server-side encryption")


class QueueDepth(CalqueModel):
    """What a pool queue holds right now (SQS's approximate counters)."""

    queue_name: str
    visible: int
    in_flight: int
    delayed: int
    dlq_visible: int
    oldest_message_age_s: int | None = None


class Item(CalqueModel):
    """One input of a run: positional and keyword arguments for the method."""

    index: int = Field(ge=0)
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)


class ItemError(CalqueModel):
    """Why one item failed: enough to debug without the worker's logs."""

    type: str
    message: str
    traceback: str = ""


class RunDocument(VersionedModel):
    """A run's documents (its results, Summaries, record and report): where one is newer than
    this calque, it is calque where the results are read that needs upgrading."""

    upgrade_hint: ClassVar[str] = "upgrade calque where the results are read (calque pool results/status)"
    version: int = SCHEMA_VERSION


class ItemResult(RunDocument):
    """The outcome of one item; exactly one of ``value`` (when ok) or ``error`` (when not)."""

    index: int = Field(ge=0)
    ok: bool
    value: Any = None
    error: ItemError | None = None
    seconds: float = Field(ge=0)

    @model_validator(mode="after")
    def _ok_xor_error(self) -> ItemResult:
        if self.ok and self.error is not None:
            raise ValueError("an ok result carries no error")
        if not self.ok and self.error is None:
            raise ValueError("a failed result must carry an error")
        return self


class Manifest(VersionedModel):
    """One claim's batch of items, staged in S3 and pointed at by a ``ClaimRef``."""

    upgrade_hint: ClassVar[str] = "upgrade calque on the pool's workers (this one did not run the claim)"
    # Version 2 added ``encoding``; a "json" manifest is still written as version 1 (``for_items``), so
    # workers of any version run ``calque pool submit``'s runs; only typed ones need version 2.
    version: int = 2
    run_id: SafeId
    claim_id: SafeId
    model: str = Field(min_length=1)
    method: str = Field(min_length=1)
    items: list[Item]
    encoding: Literal["json", "typed"] = Field(
        "json", description="json: values as written; typed: calque.models.values' encoding (calque run)"
    )

    @classmethod
    def for_items(cls, *, encoding: str = "json", **fields: Any) -> Manifest:
        return cls(version=1 if encoding == "json" else 2, encoding=encoding, **fields)

    def to_json(self) -> str:
        """A version-1 manifest without the field version 1 lacks; a typed one whole."""
        return self.model_dump_json(exclude={"encoding"} if self.version == 1 else None)

    @model_validator(mode="after")
    def _typed_is_version_2(self) -> Manifest:
        if self.encoding != "json" and self.version < 2:
            raise ValueError("a typed manifest is version 2")
        return self

    @field_validator("items")
    @classmethod
    def _indices_unique(cls, items: list[Item]) -> list[Item]:
        seen = [i.index for i in items]
        if len(seen) != len(set(seen)):
            raise ValueError("item indices must be unique within a manifest")
        return items


class ClaimRef(VersionedModel):
    """The SQS message body: a pointer to a manifest, with what the worker checks before running it."""

    upgrade_hint: ClassVar[str] = "upgrade calque on the pool's workers (this one did not run the claim)"
    version: int = SCHEMA_VERSION
    run_id: SafeId
    claim_id: SafeId
    model: str = Field(min_length=1)
    method: str = Field(min_length=1)
    manifest_uri: str = Field(pattern=r"^s3://[^/]+/.+")
    results_prefix: str = Field(pattern=r"^s3://[^/]+/.+")
    workload_digest: str | None = None
    item_count: int = Field(ge=0)
    submitted_at: datetime
    attempts: int = Field(
        0,
        ge=0,
        description="deliveries of earlier messages of this claim that counted (crashes, lost leases); a "
        "graceful release re-sends the claim with this raised by its uncounted receives, never by itself",
    )

    def body(self) -> str:
        """The message body; ``attempts`` only when non-zero, so workers that predate it read every first send."""
        return self.model_dump_json(exclude={"attempts"} if self.attempts == 0 else None)


class ClaimCost(CalqueModel):
    """What a claim (or a run) cost at an instance type's on-demand rate.

    ``fixed_usd`` is the ``@enter`` time actually paid (zero on a warm hit); ``variable_usd`` the
    time spent serving the items; ``per_item_usd`` their sum over the items.
    """

    instance_type: str
    usd_per_hour: float = Field(ge=0)
    fixed_usd: float = Field(ge=0)
    variable_usd: float = Field(ge=0)
    total_usd: float = Field(ge=0)
    per_item_usd: float | None = Field(None, ge=0)


class Summary(RunDocument):
    """What one claim cost and produced; written after every ItemResult, before the message is deleted.

    One per claim, written only if the claim has none yet; it names the one attempt's results it
    vouches for (``results_key``), so results from an attempt that lost its lease are never read.
    """

    run_id: SafeId
    claim_id: SafeId
    model: str
    method: str
    ok: bool = Field(description="false when the claim itself failed (poison, load error, deadline)")
    error: str | None = None
    items: int = Field(ge=0)
    failed: int = Field(ge=0)
    warm_hit: bool
    enter_seconds_paid: float = Field(ge=0)
    enter_count: int = Field(ge=0, description="how many times this worker process has run @enter")
    attempt: int = Field(
        ge=1, description="this delivery's attempt: the claim's carried attempts plus SQS's ApproximateReceiveCount"
    )
    worker_id: str
    instance_type: str | None = None
    workload_digest: str | None = None
    started_at: datetime
    finished_at: datetime
    claim_seconds: float = Field(ge=0)
    method_seconds: float = Field(ge=0, description="time spent inside the method for all items")
    cost: ClaimCost | None = Field(None, description="None when the worker's instance type is unknown")
    results_key: str | None = Field(
        None,
        description="the results object this Summary vouches for, relative to the run's prefix "
        "(results/<claim>/<attempt>-<worker>-<token>.jsonl); None: results/<claim>.jsonl (older workers) "
        "or none at all (poison)",
    )


class RunRecord(RunDocument):
    """What ``calque pool submit`` staged: written once under the run's prefix, read by ``results``."""

    run_id: SafeId
    model: str = Field(min_length=1)
    method: str = Field(min_length=1)
    queue_name: str
    results_prefix: str = Field(pattern=r"^s3://[^/]+/.+")
    item_count: int = Field(ge=0)
    claims: list[SafeId] = Field(description="claim ids, in item order")
    workload_digest: str | None = None
    submitted_at: datetime


class RunReport(RunDocument):
    """What a run produced and cost, folded from its claims' Summaries (``calque pool submit``)."""

    run_id: SafeId
    model: str
    method: str
    queue_name: str
    finished: bool = Field(description="every claim has a Summary")
    claims: int = Field(ge=0)
    claims_done: int = Field(ge=0)
    claims_failed: int = Field(ge=0, description="claims whose Summary says ok=false (poison, deadline)")
    items: int = Field(ge=0)
    items_ok: int = Field(ge=0)
    items_failed: int = Field(ge=0)
    warm_hits: int = Field(ge=0)
    enter_seconds_paid: float = Field(ge=0)
    wall_seconds: float = Field(ge=0)
    items_per_second: float | None = None
    cost: ClaimCost | None = None
    errors: list[str] = Field(default_factory=list, description="claim-level errors, one per failed claim")


class PoolSpec(VersionedModel):
    """What a pool is: one model kept warm, its queue, its buckets and the worker's limits."""

    upgrade_hint: ClassVar[str] = "upgrade calque on this host, or write the spec for the version it reads"
    version_label: ClassVar[str] = "pool spec"
    version: int = SCHEMA_VERSION
    model: str = Field(min_length=1, description="the model served; the queue name derives from it when no pool")
    pool: PoolName | None = Field(None, description="the pool's name (lab-a/embedder); its queue derives from it")
    workload: str = Field(
        min_length=1, description="the Modal-shaped script (a path or an s3:// URI), optionally ::Class"
    )
    method: str | None = Field(None, description="default method when a claim names none")
    parameters: dict[str, Any] = Field(default_factory=dict, description="fixed modal.parameter() values")
    region: str = "us-east-1"
    endpoint_url: str | None = None
    queue_name: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_-]{1,76}$", description="override; default pool_queue_name(model)"
    )
    bucket: str = Field(min_length=3, description="S3 bucket for manifests, results and summaries")
    prefix: str = Field("calque", description="key prefix of the pool's objects in the bucket")
    queue: QueueSettings = Field(default_factory=QueueSettings)
    batch_size: int = Field(10, ge=1, le=10_000, description="items per claim when submitting")
    max_manifest_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    max_receive_count: int = Field(
        5,
        ge=1,
        le=1000,
        description="attempts of a claim that may run: this one and each earlier one whose worker its item "
        "ended (a witnessed death); a claim that ended two workers is poisoned sooner",
    )
    item_timeout_s: Seconds | None = Field(None, gt=0)
    claim_deadline_s: Seconds | None = Field(None, gt=0)
    idle_timeout_s: Seconds | None = Field(None, gt=0)
    workers: int = Field(1, ge=1, le=64, description="worker processes on this host")
    cuda_visible_devices: list[str] | None = Field(None, description="one entry per worker")
    instance_type: str | None = None
    imds_endpoint: str = IMDS_ENDPOINT
    spot_watch: bool = Field(True, description="poll IMDSv2 for a spot interruption notice")
    spot_poll_s: Seconds = Field(5.0, gt=0, le=60, description="seconds between spot notice and lifecycle polls")
    scale_in_protection: bool = Field(
        True,
        description="on an Auto Scaling instance: protect it from scale-in while a claim is held, and drain "
        "on its termination lifecycle hook (off an Auto Scaling instance this does nothing)",
    )
    shutdown_grace_s: Seconds = Field(30.0, gt=0, le=600, description="bound on @exit and release at shutdown")
    heartbeat_s: Seconds | None = Field(None, gt=0, description="override; default a third of the visibility timeout")
    prefetch: bool = Field(True, description="receive the next claim while one drains")
    metrics_port: int | None = Field(None, ge=1, le=65535)
    metrics_addr: BindAddress = Field(
        "127.0.0.1", description="address the metrics port binds (loopback unless exposed)"
    )
    metrics_textfile: str | None = Field(None, description="a *.prom file for node_exporter's textfile collector")
    backlog_poll_s: Seconds = Field(
        15.0, ge=1, le=3600, description="seconds between reads of the queue's backlog for the metrics (when on)"
    )
    backlog_target: int | None = Field(
        None, ge=1, description="claims per instance the scaling aims at (latency_s / seconds_per_claim), exported"
    )
    backend: Literal["process"] = "process"

    @field_validator("prefix")
    @classmethod
    def _prefix_is_safe(cls, v: str) -> str:
        for part in v.strip("/").split("/") if v.strip("/") else []:
            check_id(part, f"prefix segment of {v!r}")
        return v

    @model_validator(mode="after")
    def _queue_of_named_pool(self) -> PoolSpec:
        # a named pool's queue is fixed by its name, so the workers and the submitters agree on it
        if self.pool is not None and self.queue_name is None:
            self.queue_name = pool_names(self.pool).queue
        return self

    @model_validator(mode="after")
    def _devices_per_worker(self) -> PoolSpec:
        if self.cuda_visible_devices is not None and len(self.cuda_visible_devices) != self.workers:
            raise ValueError(
                f"cuda_visible_devices has {len(self.cuda_visible_devices)} entries but workers is "
                f"{self.workers}: give one entry per worker"
            )
        return self
