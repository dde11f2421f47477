"""A pool's load records, read by submitters: has any worker loaded the workload, and which methods it has.

Workers write them (``calque.pool.worker.loadguard``); ``calque pool submit``, ``calque run`` and ``calque ramp``
read them here, into ``LoadRecord``; ``calque pool status`` reads them without pydantic
(``calque.pool.submitter.load_reads``, where the rule of ``health`` is written: serving, cannot load, or nothing
known yet, in which case submitters wait as before).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from calque.aws.aws_errors import StoreError
from calque.aws.store import RunStore, parse_s3_uri
from calque.errors import InfrastructureError, UsageError
from calque.models import LoadRecord
from calque.models.pool_loads import load_prefix
from calque.pool.submitter.load_reads import (
    get_records,
    list_records,
    load_error_message,
    split_health,
)

# How often a waiting submitter reads the records again (one LIST, a GET per changed record).
CHECK_EVERY_S = 2.0


class LoadRecords:
    """A pool's load records, fetching only the objects whose ETag changed since the last read."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self._cache: dict[str, tuple[str, LoadRecord]] = {}

    def read(self) -> list[LoadRecord]:
        bucket, key = parse_s3_uri(load_prefix(self.store))
        listed = list_records(self.store.s3, bucket, key)
        fresh = {k: cached for k, etag in listed.items() if (cached := self._cache.get(k)) and cached[0] == etag}
        changed = [k for k in listed if k not in fresh]
        for k, data in zip(changed, get_records(self.store.s3, bucket, changed), strict=True):
            if data is None:  # deleted between the LIST and the GET
                continue
            try:
                fresh[k] = (listed[k], LoadRecord.model_validate_json(data))
            except ValueError:
                continue  # a newer calque's record, or not one of ours: it says nothing we can read
        self._cache = fresh
        return sorted((r for _, r in fresh.values()), key=lambda r: r.slot)


@dataclass(frozen=True)
class PoolHealth:
    """What the records say now: the serving slots, and the newest recent failure when none serves."""

    serving: list[LoadRecord] = field(default_factory=list)
    failing: LoadRecord | None = None

    @property
    def methods(self) -> set[str] | None:
        """The methods the serving workers' class has; None when no worker serves (nothing to check against)."""
        if not self.serving:
            return None
        return {m for r in self.serving for m in r.methods}


def health(records: list[LoadRecord], now: datetime | None = None) -> PoolHealth:
    """What the records say now (``calque.pool.submitter.load_reads.split_health``)."""
    return PoolHealth(*split_health(records, now))


class PoolLoadError(InfrastructureError):
    """No worker of the pool can load its workload: the newest failure's error, from its load record."""

    def __init__(self, message: str, record: LoadRecord) -> None:
        super().__init__(message)
        self.record = record


def load_error(record: LoadRecord, model: str, *, waiting: str = "") -> PoolLoadError:
    """The error a submitter raises: the worker's error, the end of its traceback, and what to do."""
    return PoolLoadError(load_error_message(record, model, waiting=waiting), record)


def check_loadable(h: PoolHealth, model: str, *, waiting: str = "") -> None:
    """PoolLoadError when the pool cannot load its workload (no serving worker, a recent failure)."""
    if h.failing is not None:
        raise load_error(h.failing, model, waiting=waiting)


def check_method(h: PoolHealth, method: str, what: str, *, default: str) -> None:
    """UsageError when the serving workers' class has no ``method`` (``default``: a claim naming none)."""
    methods = h.methods
    if methods is None or method == default or method in methods:
        return
    first = h.serving[0]
    raise UsageError(
        f"{what}: the pool's workers serve {first.workload}, whose methods are {sorted(methods)}; "
        f"it has no method {method!r}. Call one of those (nothing was sent)"
    )


def pool_health(store: RunStore) -> PoolHealth:
    """The pool's health now; nothing known when the records cannot be read (the caller goes on as before)."""
    try:
        return health(LoadRecords(store).read())
    except StoreError:
        return PoolHealth()
