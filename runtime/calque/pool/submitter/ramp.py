"""``calque ramp``'s core: one instance, one warm pool worker on it, a ramp of item counts, then cleanup.

It makes a temporary pool for the ramp (its own queue, model ``calque-ramp/<id>``, and S3 prefix
``<prefix>/ramps/<id>`` in the caller's bucket), stages the workload and this calque's wheel
(``calque.pool.submitter.runtime_wheel``, unless ``runtime_pip`` overrides it) there, and acquires ONE instance
through the ``Acquirer`` whose user-data (``calque.pool.bootstrap``, the same bootstrap as
``playbooks/pool.yml``) starts ONE ``calque pool worker`` on the ramp's spec. Each rung is then
submitted as a pool run and read back from its Summaries: ``@enter`` runs once on that worker, so only
the first rung pays it. At the end, on an error and on Ctrl-C, the worker is stopped, the instance
terminated and the temporary queue deleted (the prefix keeps the results).

Who runs the worker is the one difference between the tiers (``ramp_workers.py``): on AWS the
instance does; offline (``CALQUE_OFFLINE=1``: moto's instances run nothing) a local worker process is
started on the very spec text the user-data carries.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from calque.aws.acquire.acquirer import Acquirer
from calque.aws.acquire.spend_gate import Consent, check_spend_limit, price_cohort, require_spend_consent
from calque.aws.clients import client, offline
from calque.aws.queue import PoolQueue
from calque.errors import CalqueError, InfrastructureError, UsageError
from calque.models import Item, ItemResult, PoolSpec, QueueSettings, RunReport, Summary
from calque.models.acquire import CohortSpec, Market, RampReport, RampRung, RootVolume
from calque.pool.bootstrap import stage_workload, worker_user_data
from calque.pool.submitter import submit as pool
from calque.pool.submitter.loads import PoolLoadError
from calque.pool.submitter.ramp_workers import InstanceWorker, LocalStandIn, RampWorker
from calque.pool.submitter.runtime_wheel import MAX_URL_TTL_S, stage_runtime

MAX_RUNG = 1_000_000
# A ramp's queue lives minutes: a short long-poll keeps the worker's shutdown quick.
RAMP_QUEUE = QueueSettings(visibility_timeout=300, receive_wait=2, max_receive_count=3)


@dataclass
class RampOptions:
    """What the caller asked for; ``calque ramp``'s flags map onto these one to one."""

    workload: str
    rungs: list[int]
    instance_type: str
    bucket: str = ""
    prefix: str = "calque"
    method: str | None = None
    items_file: str | None = None
    batch_size: int = 100
    spot: bool = False
    ttl_seconds: int = 3 * 3600
    subnets: list[str] = field(default_factory=list)
    ami: str | None = None
    ami_ssm_parameter: str | None = None
    root_volume_gib: int = 100
    instance_profile: str | None = None
    security_groups: list[str] = field(default_factory=list)
    max_hourly_usd: float | None = None
    wait_timeout_s: int = 600
    rung_timeout_s: float = 3600.0
    runtime_pip: str | None = None
    region: str | None = None
    endpoint_url: str | None = None
    profile: str | None = None


def parse_rungs(text: str) -> list[int]:
    """``"1,100,1000"`` -> ``[1, 100, 1000]``; UsageError saying what to write otherwise."""
    try:
        rungs = [int(p) for p in text.replace(" ", "").split(",") if p]
    except ValueError:
        raise UsageError(f"--rungs {text!r}: give item counts separated by commas, e.g. 1,100,1000") from None
    if not rungs or any(not 1 <= r <= MAX_RUNG for r in rungs):
        raise UsageError(f"--rungs {text!r}: give one or more item counts from 1 to {MAX_RUNG}, e.g. 1,100,1000")
    return rungs


def rung_items(n: int, pool_items: Sequence[Item] | None) -> list[Item]:
    """``n`` items: the items file's items in turn (repeating when it is shorter), or ``args=[i]``."""
    if not pool_items:
        return [Item(index=i, args=[i]) for i in range(n)]
    return [
        Item(index=i, args=pool_items[i % len(pool_items)].args, kwargs=pool_items[i % len(pool_items)].kwargs)
        for i in range(n)
    ]


def ramp_cohort(opts: RampOptions, name: str, user_data: str) -> CohortSpec:
    market: Market = "spot" if opts.spot else "on-demand"
    return CohortSpec(
        name=name,
        count=1,
        instance_types=[opts.instance_type],
        subnets=opts.subnets,
        market=market,
        ami=opts.ami,
        ami_ssm_parameter=opts.ami_ssm_parameter,
        root_volume=RootVolume(size_gib=opts.root_volume_gib),
        instance_profile=opts.instance_profile,
        security_groups=opts.security_groups,
        user_data=user_data,
        ttl_seconds=opts.ttl_seconds,
        max_hourly_usd=opts.max_hourly_usd,
        wait_timeout_s=opts.wait_timeout_s,
        pool=f"calque-ramp/{name}",
        tags={"calque-ramp": Path(opts.workload.split("::", 1)[0]).name[:200]},
    )


def ramp_spec(opts: RampOptions, name: str, workload: str, region: str) -> PoolSpec:
    """The ramp's pool: one worker on the instance, the instance type known for the cost line."""
    return PoolSpec(
        model=f"calque-ramp/{name}",
        workload=workload,
        method=opts.method,
        region=region,
        endpoint_url=opts.endpoint_url,
        bucket=opts.bucket,
        prefix=ramp_prefix(opts, name),
        queue=RAMP_QUEUE,
        batch_size=opts.batch_size,
        workers=1,
        instance_type=opts.instance_type,
        idle_timeout_s=min(opts.ttl_seconds, 3600),  # a worker the ramp lost ends itself
        shutdown_grace_s=10,
    )


def ramp_prefix(opts: RampOptions, name: str) -> str:
    return "/".join(p for p in (opts.prefix.strip("/"), "ramps", name) if p)


# -- the ramp --------------------------------------------------------------------------------------


@dataclass
class _Rung:
    report: RunReport
    summaries: dict[str, Summary]
    results: list[ItemResult]
    wall_s: float


def _run_rung(
    target: pool.PoolTarget,
    items: list[Item],
    opts: RampOptions,
    worker: RampWorker,
    k: int,
) -> _Rung:
    started = time.monotonic()
    try:
        record = pool.submit(target, items, method=opts.method, batch_size=opts.batch_size)
        store = target.store(record.queue_name)
        rep = pool.wait(store, record, timeout_s=opts.rung_timeout_s, on_progress=lambda _d, _t: worker.check())
    except PoolLoadError as exc:  # the ramp's workload is the caller's: its failure to load is a usage error
        raise UsageError(f"rung {k}: the ramp's worker could not load the workload: {exc}") from exc
    wall = time.monotonic() - started
    if not rep.finished:
        worker.check()
        raise InfrastructureError(
            f"rung {k} not finished after {opts.rung_timeout_s:g}s ({rep.claims_done} of {rep.claims} claims): "
            f"is the worker running {worker.where}? Raise --rung-timeout for a slow instance start"
        )
    if rep.claims_failed:
        raise UsageError(
            f"rung {k}: the worker refused the run: {'; '.join(rep.errors)}. Fix the workload or --method and retry"
        )
    return _Rung(rep, store.summaries(record.results_prefix), pool.results(store, record), wall)


def run_ramp(
    opts: RampOptions,
    acquirer: Acquirer,
    consent: Consent,
    *,
    progress: Callable[[str], None] | None = None,
    on_rung: Callable[[RampRung], None] | None = None,
    on_result: Callable[[ItemResult], None] | None = None,
) -> RampReport:
    """Run the ramp and return its report; worker, instance and queue are gone before this returns or raises.

    ``on_rung`` is called after each rung and ``on_result`` for each of its items (progress displays
    use them); an exception from either ends the ramp like any other error, and the cleanup still runs.
    """
    say = progress or (lambda _msg: None)
    if not opts.bucket:
        raise UsageError("no bucket: pass --bucket or set CALQUE_POOL_BUCKET (the ramp's runs go under a prefix in it)")
    if not opts.runtime_pip and opts.ttl_seconds > MAX_URL_TTL_S:
        raise UsageError(
            f"--ttl {opts.ttl_seconds} s: the staged runtime's presigned URL lives at most 7 days;"
            " shorten --ttl or pass --runtime-pip"
        )
    pool_items = pool.read_items(opts.items_file) if opts.items_file else None
    # The gate before any AWS call (pricing is the local rate table): a refused ramp makes no queue.
    # The Acquirer gates again at the launch, on the real plan.
    spend = price_cohort(1, [opts.instance_type], opts.max_hourly_usd)
    require_spend_consent(consent, 1, spend)
    check_spend_limit(spend)
    name = f"ramp-{secrets.token_hex(4)}"
    sqs = client("sqs", region=opts.region, endpoint_url=opts.endpoint_url, profile=opts.profile)
    s3 = client("s3", region=opts.region, endpoint_url=opts.endpoint_url, profile=opts.profile)
    queue = PoolQueue(sqs, f"calque-ramp/{name}")
    target = pool.PoolTarget(
        queue.model, opts.bucket, ramp_prefix(opts, name), opts.region, opts.endpoint_url, opts.profile
    )
    report = RampReport(workload=opts.workload, method=opts.method, cohort=name)
    worker: RampWorker | None = None
    queue_made = acquired = False
    try:
        say(f"temporary pool queue {queue.name} and prefix s3://{opts.bucket}/{target.prefix}/")
        queue_made = True
        queue.ensure(RAMP_QUEUE)
        workload = stage_workload(s3, opts.bucket, target.prefix, queue.name, opts.workload)
        spec = ramp_spec(opts, name, workload, str(sqs.meta.region_name))
        if opts.runtime_pip:
            user_data = worker_user_data(spec, runtime_pip=opts.runtime_pip)
        else:  # this calque and its pinned dependencies, beside the ramp's runs, for the instance's lifetime
            staged = stage_runtime(
                opts.bucket,
                target.prefix,
                ttl_s=opts.ttl_seconds,
                wheelhouse=not offline(),  # offline, a local stand-in runs the worker: nothing installs it
                region=str(sqs.meta.region_name),
                endpoint_url=opts.endpoint_url,
                profile=opts.profile,
                progress=say,
            )
            user_data = worker_user_data(
                spec,
                runtime_url=staged.url,
                runtime_sha256=staged.sha256,
                wheelhouse_url=staged.wheelhouse_url,
                wheelhouse_sha256=staged.wheelhouse_sha256,
            )
        cohort = ramp_cohort(opts, name, user_data)
        say(f"acquiring one {opts.instance_type} ({cohort.market}) as cohort {name}")
        acquired = True
        got = acquirer.apply(cohort, consent)
        report.instance = got.instances[0] if got.instances else None
        report.hourly_usd = got.hourly_usd
        instance_id = report.instance.instance_id if report.instance else "?"
        worker = LocalStandIn(spec) if offline() else InstanceWorker(acquirer, name, instance_id)
        say(f"one warm worker runs {worker.where}; its @enter runs once, on rung 0")
        for k, n in enumerate(opts.rungs):
            say(f"rung {k}: {n} item(s)")
            got_rung = _run_rung(target, rung_items(n, pool_items), opts, worker, k)
            rep = got_rung.report
            report.method = report.method or next((s.method for s in got_rung.summaries.values()), None)
            report.enter_seconds = round(report.enter_seconds + rep.enter_seconds_paid, 4)
            report.enter_count = max([report.enter_count, *(s.enter_count for s in got_rung.summaries.values())])
            for result in got_rung.results:
                if on_result:
                    on_result(result)
            first_failure = next((r.error for r in got_rung.results if r.error is not None), None)
            if first_failure is not None:
                first = f"{first_failure.type}: {first_failure.message}"
                say(f"rung {k}: {rep.items_failed} item(s) failed; the first: {first}")
            rung = RampRung(
                rung=k,
                items=n,
                ok=rep.items_ok,
                failed=rep.items_failed,
                wall_s=round(got_rung.wall_s, 4),
                items_per_s=round(n / got_rung.wall_s, 3) if got_rung.wall_s > 0 else 0.0,
                enter_seconds_paid=round(rep.enter_seconds_paid, 4),
            )
            report.rungs.append(rung)
            if on_rung:
                on_rung(rung)
    except BaseException as exc:  # Ctrl-C included: record it, clean up below, re-raise
        report.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        _cleanup(report, name, acquirer, queue, worker, say, acquired=acquired, queue_made=queue_made)
    return report


def _cleanup(
    report: RampReport,
    name: str,
    acquirer: Acquirer,
    queue: PoolQueue,
    worker: RampWorker | None,
    say: Callable[[str], None],
    *,
    acquired: bool,
    queue_made: bool,
) -> None:
    """Stop the worker, terminate the instance, delete the queue; every step runs, the first failure raises."""
    failures: list[str] = []
    if worker is not None:
        say("stopping the worker")
        try:
            worker.stop()
        except (OSError, CalqueError) as exc:
            failures.append(f"could not stop the worker ({exc})")
    if acquired:
        say(f"terminating cohort {name}")
        try:
            # the ramp's own cohort, made above: ending it is part of what the spend consent covered
            report.terminated = acquirer.release(name, Consent(terminate=True)).terminated
        except CalqueError as exc:
            failures.append(
                f"could not terminate cohort {name} ({exc}); end it with the calque.gpu.ec2_cohort module "
                f"(name: {name}, state: absent) or terminate the instances tagged calque:cohort={name}"
            )
    if queue_made:
        say(f"deleting the temporary queue {queue.name}")
        try:
            queue.remove()
        except CalqueError as exc:
            failures.append(f"could not delete queue {queue.name} ({exc}); delete it and {queue.dlq} by hand")
    for f in failures:
        say(f"error: {f}")
    if failures and report.error is None:
        raise InfrastructureError("; ".join(failures))
