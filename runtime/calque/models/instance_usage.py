"""A pool instance's usage records: the contract between the components on the instance that write them
(``calque pool warm-up`` at every boot, each worker's start, heartbeat and stop, the drain on the
termination hook: ``pool/worker/usage.py``) and the ledger that reads them (``ledger/instance_records.py``).

One record is one stretch of time one component saw its instance up: from ``started_at`` (the kernel's
boot time for the boot's first writer, the warm-up; a worker's own start for a worker) to ``ended_at``
where it knows the end (the instance is terminating, or going to stop into the warm pool) or else to
``seen_at``, its last heartbeat. The writer overwrites its own object as time passes and never touches
another's, so no two writers race; the reader takes the union of an instance's stretches. Records stay
in the pool's bucket under ``<base>/usage/instances/`` for as long as the bucket keeps them: EC2
forgets a terminated instance within about an hour, and a warm-pool restart resets its ``LaunchTime``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from calque.models.base import VersionedModel
from calque.models.pool_loads import RunPlace
from calque.models.versions import POOL_SCHEMA_VERSION

InstanceEnd = Literal["terminated", "stopped"]


class InstanceRecord(VersionedModel):
    """One stretch of one pool instance's time up, as one of its own components saw it."""

    upgrade_hint: ClassVar[str] = "upgrade calque where the ledger is read so it reads what the pool's instances write"
    version: int = POOL_SCHEMA_VERSION
    pool: str
    instance_id: str
    instance_type: str
    writer: str = Field(description="the component: warm-up, worker-0, worker-1, ...")
    started_at: datetime = Field(description="the stretch's start: the boot (warm-up) or the worker's start")
    seen_at: datetime = Field(description="the writer's last heartbeat: the instance was up then")
    ended_at: datetime | None = Field(None, description="the instance's end of this stretch, where the writer knew it")
    end: InstanceEnd | None = Field(None, description="terminated (the drain hook) or stopped (into the warm pool)")
    lifecycle_state: str | None = Field(None, description="Auto Scaling's target lifecycle state when it began")
    busy: bool = Field(False, description="a worker held a claim in this stretch (its seconds: the claims' Summaries)")


@dataclass(frozen=True)
class UsagePlace:
    """A pool's bucket and key base, where no ``RunStore`` is at hand (the group's tag, the ledger)."""

    bucket: str
    base: str


def usage_prefix(store: RunPlace) -> str:
    """The ``s3://`` prefix of a pool's instance usage records (inside the workers' IAM grant)."""
    return f"s3://{store.bucket}/{store.base}/usage/instances/"


def record_uri(store: RunPlace, instance_id: str, started_at: datetime, writer: str) -> str:
    """One writer's record of one stretch: ``<prefix><instance>/<start in ms>-<writer>.json``."""
    return f"{usage_prefix(store)}{instance_id}/{int(started_at.timestamp() * 1000)}-{writer}.json"


# A writer refreshes its record this often; a record with no end whose heartbeat is older than
# RECORD_LIVE_S ended at its last heartbeat (the instance stopped or died without a word).
RECORD_HEARTBEAT_S = 60.0
RECORD_LIVE_S = 3 * RECORD_HEARTBEAT_S
