"""What ``calque pool status`` shows, read from AWS: a pool's queue depth, its workers' load records and,
for a named pool, its Auto Scaling group; or one run's report, dead-lettered claims settled first.

The CLI (``cli/pool_status.py``) only renders these. ``status`` reads the load records through a
plain ``RunStore``, not ``calque.pool.submit``'s ``PoolTarget``: the submit path (pricing, the staging
pool) is not loaded to look at a queue (bench/cli_startup.py's ``pool status`` row).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from calque.aws.clients import LazyClient, client
from calque.aws.queue import PoolQueue
from calque.errors import UsageError
from calque.models.pool_names import PoolNames, pool_names

if TYPE_CHECKING:
    from calque.aws.acquire.scaling import ScalingStatus
    from calque.aws.store import RunStore
    from calque.models import LoadRecord, PoolStatus, QueueDepth, RunReport
    from calque.pool.loads import PoolLoadError


@dataclass(frozen=True)
class PoolAddress:
    """Which pool, and where its AWS parts are: ``--model``/``--pool``, the bucket and the AWS options."""

    model: str | None
    pool: str | None
    bucket: str | None
    prefix: str
    region: str | None = None
    endpoint_url: str | None = None
    profile: str | None = None

    @property
    def label(self) -> str:
        """The name the queue is looked up and reported by (``--model`` labels a named pool's queue)."""
        return self.model or self.pool or ""

    def names(self) -> PoolNames | None:
        """A named pool's resource names (ValueError for an invalid name); None for a pool named by its model."""
        if self.model is None and self.pool is None:
            raise UsageError("give --pool (a named pool, e.g. lab-a/embedder) or --model (a pool named by its model)")
        return None if self.pool is None else pool_names(self.pool)

    def client(self, service: str) -> Any:
        return client(service, region=self.region, endpoint_url=self.endpoint_url, profile=self.profile)

    def lazy_client(self, service: str) -> LazyClient:
        return LazyClient(service, region=self.region, endpoint_url=self.endpoint_url, profile=self.profile)

    def need_bucket(self) -> str:
        if not self.bucket:
            raise UsageError("no bucket: pass --bucket or set CALQUE_POOL_BUCKET to the pool's S3 bucket")
        return self.bucket


@dataclass(frozen=True)
class PoolView:
    """A pool as ``calque pool status`` shows it: ``workers`` with a bucket, ``group`` for a named pool."""

    depth: QueueDepth
    workers: PoolStatus | None
    group: ScalingStatus | None


@dataclass(frozen=True)
class RunView:
    """One run: its report, and the pool's load error when the run waits on workers that cannot load."""

    report: RunReport
    load_error: PoolLoadError | None


def _queue(address: PoolAddress, names: PoolNames | None) -> tuple[PoolQueue, Any]:
    cloudwatch = address.lazy_client("cloudwatch")
    queue = PoolQueue(address.lazy_client("sqs"), address.label, names.queue if names else None, cloudwatch=cloudwatch)
    return queue, cloudwatch


def _store(address: PoolAddress, queue: PoolQueue) -> RunStore:
    from calque.aws.store import RunStore

    return RunStore(address.client("s3"), address.need_bucket(), address.prefix, queue.name)


def _workers(address: PoolAddress, queue: PoolQueue) -> tuple[list[LoadRecord], str | None]:
    from calque.pool.loads import LoadRecords, health, load_error

    records = LoadRecords(_store(address, queue)).read()
    failing = health(records).failing
    return records, None if failing is None else str(load_error(failing, address.label))


def status(address: PoolAddress) -> PoolView:
    """The queue's depth; with a bucket, every worker slot's load record; for a named pool, its group.

    The three are independent reads of three services: they run at once, each making its clients on
    its own thread (``LazyClient``), so the command waits on the slowest read rather than their sum.
    """
    names = address.names()
    queue, cloudwatch = _queue(address, names)
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="calque-status") as pool:
        workers_read = pool.submit(_workers, address, queue) if address.bucket else None
        group_read = None
        if names is not None:
            from calque.aws.acquire.scaling import PoolScaling, read_group

            group_read = pool.submit(read_group, PoolScaling(address.lazy_client("autoscaling"), cloudwatch, names))
        depth = queue.depth()
        read = None if workers_read is None else workers_read.result()
        reading = None if group_read is None else group_read.result()
    workers = None
    if read is not None:
        from calque.models import PoolStatus

        workers = PoolStatus(**depth.model_dump(), workers=read[0], load_error=read[1])
    group = None
    if reading is not None:
        from calque.aws.acquire.scaling import scaling_status

        group = scaling_status(reading, depth)
    return PoolView(depth=depth, workers=workers, group=group)


def run_status(address: PoolAddress, run_id: str) -> RunView:
    """Run ``run_id``'s report, its dead-lettered claims recorded as failed first."""
    from calque.pool import submit as core
    from calque.pool.deadletter import settle_dead_letters
    from calque.pool.loads import LoadRecords, health, load_error

    queue, _ = _queue(address, address.names())
    target = core.PoolTarget(
        address.label,
        address.need_bucket(),
        address.prefix,
        address.region,
        address.endpoint_url,
        address.profile,
        queue.name,
    )
    store, record = core.load_run(target, run_id)
    settle_dead_letters(queue, store)
    report = core.report(record, store.summaries(record.results_prefix))
    failing = health(LoadRecords(store).read()).failing
    why = None if report.finished or failing is None else load_error(failing, address.label)
    return RunView(report=report, load_error=why)
