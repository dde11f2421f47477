"""A pool's load records read from S3 and judged, without pydantic (``calque pool status``'s start-up).

``calque.pool.submitter.loads`` reads the same objects through ``list_records``/``get_records`` into its model,
``LoadRecord``, and judges them by the same rule (``split_health``); ``calque pool status`` reads them
into ``LoadView``. The rule: a pool *serves* while some slot's record says serving and was refreshed
within ``LIVE_S``; it *cannot load* when none serves and a slot failed within ``FRESH_S`` (a failing
worker rewrites its record at every restart, backoff included, so a pool that keeps failing always
has a fresh one). Otherwise nothing is known (no worker has started yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar

from calque.aws.naming import pool_key_base
from calque.aws.object_reads import get_many, list_etags
from calque.models.pool_loads import FRESH_S, LIVE_S
from calque.models.pool_views import LoadView, load_view
from calque.models.view_reader import ViewError


class Loaded(Protocol):
    """What the rule and the error read of a load record: ``LoadRecord`` and ``LoadView`` alike."""

    @property
    def state(self) -> str: ...
    @property
    def at(self) -> datetime: ...
    @property
    def seen_at(self) -> datetime: ...
    @property
    def workload(self) -> str: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def traceback(self) -> str | None: ...
    @property
    def failures(self) -> int: ...
    @property
    def retry_in_s(self) -> float: ...


R = TypeVar("R", bound=Loaded)


def split_health(records: Sequence[R], now: datetime | None = None) -> tuple[list[R], R | None]:
    """(the serving records, the newest recent failure when none serves), by the rule above."""
    now = now or datetime.now(timezone.utc)
    serving = [r for r in records if r.state == "serving" and (now - r.seen_at).total_seconds() <= LIVE_S]
    failed = [r for r in records if r.state == "failed" and (now - r.at).total_seconds() <= FRESH_S]
    newest = max(failed, key=lambda r: r.at) if failed and not serving else None
    return serving, newest


def _ago(then: datetime, now: datetime) -> str:
    s = max(0, int((now - then).total_seconds()))
    return f"{s}s" if s < 120 else f"{s // 60}m"


def load_error_message(record: Loaded, model: str, *, waiting: str = "") -> str:
    """What a submitter says when no worker can load: the worker's error, its traceback's end, what to do."""
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
    return "\n".join(lines)


def load_key_prefix(prefix: str, queue_name: str) -> str:
    """The key under which a pool's workers write their load records, one object per slot."""
    return f"{pool_key_base(prefix, queue_name)}/load/"


def list_records(s3: Any, bucket: str, key_prefix: str) -> dict[str, str]:
    """Every load record's key and ETag (a reader fetches only those whose ETag changed)."""
    return list_etags(s3, bucket, key_prefix, "load records")


def get_records(s3: Any, bucket: str, keys: list[str]) -> list[bytes | None]:
    """Each record's bytes; None for one deleted between the LIST and the GET."""
    return get_many(s3, bucket, keys)


def read_load_views(s3: Any, bucket: str, key_prefix: str) -> list[LoadView]:
    """Every slot's load record, by slot; a record this calque cannot read (a newer calque's, or not one
    of ours) says nothing and is left out, as ``calque.pool.submitter.loads.LoadRecords`` leaves it out."""
    keys = list(list_records(s3, bucket, key_prefix))
    views = []
    for data in get_records(s3, bucket, keys):
        if data is None:
            continue
        try:
            views.append(load_view(data))
        except ViewError:
            continue
    return sorted(views, key=lambda v: v.slot)
