"""A pool's load records, read by submitters: has any worker loaded the workload, and which methods it has.

Workers write them (``calque.pool.loadguard``); ``calque pool submit``, ``calque run`` and
``calque pool status`` read them. The rule (``health``): a pool *serves* while some slot's record
says serving and was refreshed within ``LIVE_S``; it *cannot load* when none serves and a slot
failed within ``FRESH_S`` (a failing worker rewrites its record at every restart, backoff
included, so a pool that keeps failing always has a fresh one). Otherwise nothing is known (no
worker has started yet) and submitters wait as before.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone

from calque.aws.errors import aws_errors
from calque.aws.store import RunStore, StoreError, parse_s3_uri
from calque.errors import InfrastructureError, UsageError
from calque.models import LoadRecord

# A serving worker refreshes its record this often; three missed refreshes and it no longer counts.
HEARTBEAT_S = 60.0
LIVE_S = 3 * HEARTBEAT_S
# A failure counts this long: longer than the longest backoff hold plus a restart delay and a load.
FRESH_S = 900.0
# How often a waiting submitter reads the records again (one LIST, a GET per changed record).
CHECK_EVERY_S = 2.0

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def load_prefix(store: RunStore) -> str:
    return f"s3://{store.bucket}/{store.base}/load/"


def slot_uri(store: RunStore, slot: str) -> str:
    return f"{load_prefix(store)}{_UNSAFE.sub('-', slot).strip('-') or 'worker'}.json"


class LoadRecords:
    """A pool's load records, fetching only the objects whose ETag changed since the last read."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self._cache: dict[str, tuple[str, LoadRecord]] = {}

    def read(self) -> list[LoadRecord]:
        bucket, key = parse_s3_uri(load_prefix(self.store))
        listed: dict[str, str] = {}
        with aws_errors(f"list the load records under s3://{bucket}/{key}", error=StoreError):
            for page in self.store.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
                listed.update({o["Key"]: o.get("ETag", "") for o in page.get("Contents", [])})
        fresh = {k: cached for k, etag in listed.items() if (cached := self._cache.get(k)) and cached[0] == etag}
        changed = [k for k in listed if k not in fresh]
        # one GET per changed record, several at once: a pool of many slots costs about one round trip
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(changed))), thread_name_prefix="calque-loads") as pool:
            bodies = list(pool.map(lambda k: self.store.get(f"s3://{bucket}/{k}"), changed))
        for k, data in zip(changed, bodies, strict=True):
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
    now = now or datetime.now(timezone.utc)
    serving = [r for r in records if r.state == "serving" and (now - r.seen_at).total_seconds() <= LIVE_S]
    failed = [r for r in records if r.state == "failed" and (now - r.at).total_seconds() <= FRESH_S]
    newest = max(failed, key=lambda r: r.at) if failed and not serving else None
    return PoolHealth(serving, newest)


class PoolLoadError(InfrastructureError):
    """No worker of the pool can load its workload: the newest failure's error, from its load record."""

    def __init__(self, message: str, record: LoadRecord) -> None:
        super().__init__(message)
        self.record = record


def _ago(then: datetime, now: datetime) -> str:
    s = max(0, int((now - then).total_seconds()))
    return f"{s}s" if s < 120 else f"{s // 60}m"


def load_error(record: LoadRecord, model: str, *, waiting: str = "") -> PoolLoadError:
    """The error a submitter raises: the worker's error, the end of its traceback, and what to do."""
    now = datetime.now(timezone.utc)
    times = "once" if record.failures <= 1 else f"{record.failures} times in a row"
    tail = "\n".join((record.traceback or "").rstrip().splitlines()[-6:])
    retry = f"; it retries in {record.retry_in_s:g}s" if record.retry_in_s else ""
    lines = [
        f"the pool's workers cannot load their workload {record.workload}: worker {record.worker_id} "
        f"failed {_ago(record.at, now)} ago ({times}{retry}): {record.error}",
        *([tail] if tail else []),
        f"Fix the workload and restart the workers; `calque pool status --model {model}` shows every "
        "worker's load record." + (f" {waiting}" if waiting else ""),
    ]
    return PoolLoadError("\n".join(lines), record)


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
