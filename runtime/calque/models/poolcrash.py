"""What a worker's witness saw when the process running a claim's item died: the evidence against a claim.

Written by the witness (``calque.pool.worker.witness``) only, at ``runs/<run>/running/<claim>/<attempt>.json``,
and read by the next worker's check (``calque.pool.worker.crashes``): two of them poison the claim.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import Field

from calque.models.base import VersionedModel
from calque.models.pool import SCHEMA_VERSION


class CrashMark(VersionedModel):
    """One attempt of a claim during which the worker process died running its items, seen by its witness."""

    upgrade_hint: ClassVar[str] = "upgrade calque on the pool's workers"
    version: int = SCHEMA_VERSION
    claim_id: str = Field(min_length=1)
    attempt: int = Field(ge=1, description="the delivery's attempt number (carried attempts + receive count)")
    worker_id: str = Field(min_length=1, description="host:pid[/index] of the worker that died")
    items: list[int] = Field(description="the item indices that were running when it died")
    cause: str = Field(min_length=1, description="how it died: 'killed by SIGSEGV', 'exited with code 3'")
    at: datetime
