"""What ``calque pool status`` shows, read from AWS: a pool's queue depth, its workers' load records and,
for a named pool, its Auto Scaling group; or one run's report, dead-lettered claims settled first.

The CLI (``cli/pool_status.py``) only renders these. ``status`` imports no pydantic: it reads the
queue, the load records and the group into the views of ``calque.models.pool_views``
(``calque.aws.queue_depth``, ``calque.pool.submitter.load_reads``, ``calque.aws.acquire.group_status``), and
``PoolView.document`` makes the models of them only for ``--json`` (bench/pool_status.py). ``run_status``
uses the models throughout: a run's report is read through ``calque.pool.submitter.submit``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from calque.aws.clients import LazyClient, client
from calque.aws.naming import dlq_name, pool_queue_name
from calque.errors import UsageError
from calque.models.pool_names import PoolNames, pool_names
from calque.models.pool_views import DepthView, LoadView, ScalingStatusView

if TYPE_CHECKING:
    from calque.aws.queue import PoolQueue
    from calque.models import RunReport
    from calque.pool.submitter.loads import PoolLoadError


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

    depth: DepthView
    workers: list[LoadView] | None
    load_error: str | None
    group: ScalingStatusView | None

    def document(self) -> Any:
        """What ``--json`` prints, as the models: the group's ``ScalingStatus`` and the queue's ``PoolStatus``
        (the depth and the workers) under ``scaling`` and ``workers`` when there are both, else the one
        there is (``QueueDepth`` alone without a bucket or a group)."""
        from calque.aws.acquire.scaling import ScalingStatus
        from calque.models import PoolStatus, QueueDepth

        group = None if self.group is None else ScalingStatus.model_validate(asdict(self.group))
        workers = None
        if self.workers is not None:
            records = [asdict(w) for w in self.workers]
            workers = PoolStatus(**asdict(self.depth), workers=records, load_error=self.load_error)
        if group is not None and workers is not None:
            return {"scaling": group.model_dump(mode="json"), "workers": workers.model_dump(mode="json")}
        if group is not None:
            return group
        return workers if workers is not None else QueueDepth.model_validate(asdict(self.depth))


@dataclass(frozen=True)
class RunView:
    """One run: its report, and the pool's load error when the run waits on workers that cannot load."""

    report: RunReport
    load_error: PoolLoadError | None


def _queue(address: PoolAddress, names: PoolNames | None) -> PoolQueue:
    from calque.aws.queue import PoolQueue

    cloudwatch = address.lazy_client("cloudwatch")
    return PoolQueue(address.lazy_client("sqs"), address.label, names.queue if names else None, cloudwatch=cloudwatch)


def _workers(address: PoolAddress, queue_name: str) -> tuple[list[LoadView], str | None]:
    from calque.pool.submitter.load_reads import load_error_message, load_key_prefix, read_load_views, split_health

    views = read_load_views(address.client("s3"), address.need_bucket(), load_key_prefix(address.prefix, queue_name))
    failing = split_health(views)[1]
    return views, None if failing is None else load_error_message(failing, address.label)


def _depth(address: PoolAddress, queue_name: str) -> DepthView:
    from calque.aws.queue_depth import lookup_queue, missing_queue, read_depth

    sqs = address.lazy_client("sqs")
    url = lookup_queue(sqs, queue_name)
    if url is None:
        raise missing_queue(address.label, queue_name)
    return read_depth(sqs, address.lazy_client("cloudwatch"), queue_name, dlq_name(queue_name), url)


def status(address: PoolAddress) -> PoolView:
    """The queue's depth; with a bucket, every worker slot's load record; for a named pool, its group.

    The three are independent reads of three services: they run at once, each making its clients on
    its own thread (``LazyClient``), so the command waits on the slowest read rather than their sum.
    """
    names = address.names()
    queue_name = names.queue if names else pool_queue_name(address.label)
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="calque-status") as pool:
        workers_read = pool.submit(_workers, address, queue_name) if address.bucket else None
        group_read = None
        if names is not None:
            from calque.aws.acquire.group_status import read_group

            group_read = pool.submit(read_group, address.lazy_client("autoscaling"), names)
        depth = _depth(address, queue_name)
        workers, load_error = (None, None) if workers_read is None else workers_read.result()
        reading = None if group_read is None else group_read.result()
    group = None
    if reading is not None:
        from calque.aws.acquire.group_status import scaling_status

        group = scaling_status(reading, depth)
    return PoolView(depth=depth, workers=workers, load_error=load_error, group=group)


def run_status(address: PoolAddress, run_id: str) -> RunView:
    """Run ``run_id``'s report, its dead-lettered claims recorded as failed first."""
    from calque.pool.submitter import submit as core
    from calque.pool.submitter.deadletter import settle_dead_letters
    from calque.pool.submitter.loads import LoadRecords, health, load_error

    queue = _queue(address, address.names())
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
