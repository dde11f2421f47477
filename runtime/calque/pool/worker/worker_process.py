"""Running workers as processes: one per GPU, signals, the exit bound, metrics.

``run_worker(spec, index=)`` is what ``calque pool worker --spec FILE [--index N]`` does in one
process; ``run_workers(spec_path, spec)`` starts ``spec.workers`` of them (each with its own
``CUDA_VISIBLE_DEVICES`` entry, through ``calque.pool.bootstrap.start_worker_process``) and forwards
SIGTERM/SIGINT to them.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calque.aws.clients import client
from calque.aws.imds import metadata_client
from calque.aws.pricing import hourly_usd
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.errors import UsageError
from calque.models import PoolSpec
from calque.models.pool_loads import load_prefix
from calque.pool.bootstrap import materialize_workload, start_worker_process
from calque.pool.worker.instance import AsgInstance, InstanceGuard, NoInstance, discover
from calque.pool.worker.instance_ready import skip_built
from calque.pool.worker.loadguard import LoadGuard
from calque.pool.worker.loop import Worker, WorkerReport
from calque.pool.worker.slots import host_slot
from calque.pool.worker.usage import InstanceUsage, RecordedInstance, boot_time
from calque.pool.worker.witness import WitnessLine, witnessed
from calque.pool.worker.worker_metrics import Metrics, worker_labels
from calque.warm import WarmSupervisor
from calque.warm.loader import load_workload

log = logging.getLogger("calque.pool")


def _setup_logging() -> None:
    root = logging.getLogger("calque")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s calque-worker[%(process)d] %(levelname)s %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)


def _instance_type(spec: PoolSpec) -> str | None:
    if spec.instance_type:
        return spec.instance_type
    imds = metadata_client(spec.imds_endpoint) if spec.spot_watch else None
    if imds is None:
        return None
    try:
        return imds.get("instance-type")
    except OSError:
        return None


def _instance_guard(spec: PoolSpec) -> InstanceGuard:
    """Scale-in protection and the drain hook when this is an Auto Scaling instance, else nothing."""
    imds = metadata_client(spec.imds_endpoint) if spec.scale_in_protection else None
    if imds is None:
        return NoInstance()
    return discover(
        imds,
        lambda: client("autoscaling", region=spec.region, endpoint_url=spec.endpoint_url),
    )


def _recorded(
    spec: PoolSpec, store: RunStore, instance: InstanceGuard, instance_type: str | None, index: int | None
) -> InstanceGuard:
    """The guard, keeping this worker's usage record of its Auto Scaling instance from now (none off one:
    a laptop, a long-lived host with no group is no pool instance the ledger prices)."""
    if not isinstance(instance, AsgInstance) or spec.pool is None or not instance_type:
        return instance
    writer = "worker" if index is None else f"worker-{index}"
    # from the boot: the instance was up (and paid) while this worker loaded, whoever recorded it then
    usage = InstanceUsage(store, spec.pool, instance.instance_id, instance_type, writer, boot_time())
    return RecordedInstance(instance, usage.start())


def run_worker(spec: PoolSpec, *, index: int | None = None) -> WorkerReport:
    """Load and enter the workload, then serve the pool queue until SIGTERM, a spot notice or idle.

    The worker runs in a child of this process, its witness (``calque.pool.worker.witness``), which marks a
    claim whose item ended the worker; the witness exits as the worker did.
    """
    _setup_logging()
    if index is not None and spec.cuda_visible_devices:
        if index >= len(spec.cuda_visible_devices):
            raise UsageError(f"--index {index} but the spec lists {len(spec.cuda_visible_devices)} devices")
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.cuda_visible_devices[index]
    # the witness's pid: the one systemd, an operator and the load record see
    worker_id = f"{socket.gethostname()}:{os.getpid()}" + (f"/{index}" if index is not None else "")
    return witnessed(lambda line: _serve(spec, index, worker_id, line), worker_id=worker_id, store=lambda: _store(spec))


def _store(spec: PoolSpec) -> RunStore:
    s3 = client("s3", region=spec.region, endpoint_url=spec.endpoint_url)
    return RunStore(s3, spec.bucket, spec.prefix, PoolQueue(None, spec.model, spec.queue_name).name)


def _serve(spec: PoolSpec, index: int | None, worker_id: str, line: WitnessLine) -> WorkerReport:
    sqs = client("sqs", region=spec.region, endpoint_url=spec.endpoint_url, max_pool_connections=16)
    s3 = client("s3", region=spec.region, endpoint_url=spec.endpoint_url, max_pool_connections=16)
    pool_queue = PoolQueue(sqs, spec.model, spec.queue_name)
    store = RunStore(s3, spec.bucket, spec.prefix, pool_queue.name)
    host = socket.gethostname()
    records = f"{s3.meta.endpoint_url} {load_prefix(store)}"  # where this worker's load record goes
    guard = LoadGuard(store, spec.workload, host_slot(host, records, index), worker_id)
    with guard.loading():  # a failure is recorded where submitters look, then WorkerLoadError (exit 3)
        spec = materialize_workload(spec)  # an s3:// workload is fetched once per worker process
        pool_queue.url()  # fail before the (slow) enter when the queue does not exist
        instance_type = _instance_type(spec)
        if instance_type:
            hourly_usd(instance_type)  # an unknown type is an error now, not a missing cost later
        log.info("loading %s for model %s (queue %s)", spec.workload, spec.model, pool_queue.name)
        workload = skip_built(load_workload(spec.workload, dict(spec.parameters)))  # the bootstrap's @build
        sup = WarmSupervisor.from_workload(
            workload, item_timeout_s=spec.item_timeout_s, claim_deadline_s=spec.claim_deadline_s
        )
    log.info("entered in %.3fs (enter count %d); serving", sup.enter_seconds, sup.enter_count)
    metrics = Metrics(worker_labels(spec.model, worker_id, spec.pool))
    instance = _recorded(spec, store, _instance_guard(spec), instance_type, index)
    worker = Worker(
        spec,
        sup,
        pool_queue,
        store,
        worker_id=worker_id,
        metrics=metrics,
        instance_type=instance_type,
        instance=instance,
        witness=line,
    )
    if spec.metrics_port is not None:
        port = metrics.serve(spec.metrics_port + (index or 0), spec.metrics_addr)
        log.info("metrics on http://%s:%d/metrics", spec.metrics_addr, port)
    if spec.metrics_textfile and index is not None:
        stem, dot, ext = spec.metrics_textfile.rpartition(".")
        spec = spec.model_copy(update={"metrics_textfile": f"{stem}-{index}.{ext}" if dot else f"{ext}-{index}"})
        worker.spec = spec
    _install_signals(worker, spec)
    guard.serving(sup)  # the class's methods, for submitters to check calls against; refreshed while serving
    try:
        rep = worker.serve()  # a fatal error still stops it in order (releases, says so to the witness)
    finally:
        metrics.close()
        guard.stopped()
    log.info("stopped (%s) after %d claims; enter count %d", rep.stop_reason, rep.claims, rep.enter_count)
    return rep


def shutdown_bound_s(spec: PoolSpec) -> float:
    """Seconds a stopping worker may take before it exits on its own (the receiver's last poll, at most
    ``POLL_SLICE_S``, the writers' flush and ``@exit``, each bounded by ``shutdown_grace_s``, and a margin).

    A supervisor's stop timeout (systemd's ``TimeoutStopSec``, the pool_worker role) must exceed it.
    """
    from calque.pool.worker.loop import POLL_SLICE_S

    return min(spec.queue.receive_wait, POLL_SLICE_S) + 2 * spec.shutdown_grace_s + 5


def _install_signals(worker: Worker, spec: PoolSpec) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    bound = shutdown_bound_s(spec)

    def on_signal(signum: int, _frame: Any) -> None:
        if worker.stopping:
            return
        worker.request_stop(signal.Signals(signum).name.lower())
        # Last resort so a hung @exit or method thread cannot keep a stopping worker alive.
        threading.Thread(target=_exit_after, args=(bound,), name="calque-exit-bound", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _exit_after(seconds: float) -> None:
    time.sleep(seconds)
    log.error("shutdown did not finish within %.0fs: exiting now", seconds)
    logging.shutdown()
    os._exit(1)


def run_workers(spec_path: str | Path, spec: PoolSpec, *, extra_args: Sequence[str] = ()) -> list[int]:
    """Start ``spec.workers`` worker processes (each given ``extra_args``: the parent's override flags),
    forward SIGTERM/SIGINT, wait; their exit codes."""
    _setup_logging()
    children = [start_worker_process(spec_path, index=i, extra_args=extra_args) for i in range(spec.workers)]
    log.info("started %d workers: pids %s", len(children), [c.pid for c in children])

    def forward(signum: int, _frame: Any) -> None:
        for c in children:
            if c.poll() is None:
                c.send_signal(signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
    return [c.wait() for c in children]
