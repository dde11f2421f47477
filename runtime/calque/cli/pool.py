"""``calque pool ...``: warm pools: submit runs, read results, run workers, look at queues."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import asdict
from pathlib import Path

import click

from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.cli.options import aws_options, json_option
from calque.cli.output import emit, table
from calque.errors import InfrastructureError, PartialFailure, UsageError
from calque.models import QueueDepth, RunRecord, RunReport
from calque.pool import submit as core
from calque.pool.cost import cost_line
from calque.pool.deadletter import settle_dead_letters
from calque.pool.submit import PoolTarget


@click.group()
def pool() -> None:
    """Warm pools: one SQS queue per model and resident workers that keep the model loaded."""


def _render_depth(d: QueueDepth) -> str:
    age = "-" if d.oldest_message_age_s is None else f"{d.oldest_message_age_s}s"
    return table(
        ["queue", "visible", "in flight", "delayed", "dlq", "oldest"],
        [[d.queue_name, d.visible, d.in_flight, d.delayed, d.dlq_visible, age]],
    )


# -- worker ---------------------------------------------------------------------------------------


@pool.command()
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False), help="PoolSpec file (YAML).")
@click.option("--index", type=int, default=None, help="Run only worker N of the spec (systemd template units).")
@click.option("--idle-timeout", type=float, default=None, help="Override: exit after this many idle seconds.")
@click.option("--metrics-port", type=int, default=None, help="Override: serve Prometheus metrics on 127.0.0.1:PORT.")
@click.option("--metrics-textfile", default=None, help="Override: write metrics to this node_exporter .prom file.")
@click.option("--instance-type", default=None, help="Override: the EC2 instance type (for the cost line).")
@click.option("--imds-endpoint", default=None, help="Override: the instance metadata service address.")
def worker(
    spec_path: str,
    index: int | None,
    idle_timeout: float | None,
    metrics_port: int | None,
    metrics_textfile: str | None,
    instance_type: str | None,
    imds_endpoint: str | None,
) -> None:
    """Serve a pool: enter once, then claim, run and summarise until SIGTERM, a spot notice or idle.

    With ``workers: N`` in the spec and no --index, starts N worker processes, one per
    CUDA_VISIBLE_DEVICES entry, and forwards signals to them.
    """
    from calque.pool.process import run_worker, run_workers
    from calque.pool.spec import load_spec

    spec = load_spec(
        spec_path,
        idle_timeout_s=idle_timeout,
        metrics_port=metrics_port,
        metrics_textfile=metrics_textfile,
        instance_type=instance_type,
        imds_endpoint=imds_endpoint,
    )
    if index is None and spec.workers > 1:
        codes = run_workers(spec_path, spec)
        if any(codes):
            raise PartialFailure(f"worker exit codes {codes}")
        return
    rep = run_worker(spec, index=index)
    if rep.exit_errors:
        raise PartialFailure(f"@exit hooks failed: {'; '.join(rep.exit_errors)}")


@pool.command("user-data")
@click.option("--spec", "spec_path", required=True, help="PoolSpec file (YAML), or - for stdin.")
@click.option(
    "--runtime-url",
    default=None,
    help="Presigned URL of the staged calque wheel (from `calque pool stage-runtime`); needs --runtime-sha256.",
)
@click.option("--runtime-sha256", default=None, help="The staged wheel's sha256, checked on the instance.")
@click.option(
    "--runtime-pip",
    default=None,
    help="Override: pip requirement or URL that installs calque on the instance (wins over --runtime-url).",
)
def user_data(spec_path: str, runtime_url: str | None, runtime_sha256: str | None, runtime_pip: str | None) -> None:
    """Print the EC2 user-data that makes an instance a worker of this pool (systemd unit included).

    playbooks/pool.yml passes it to calque.gpu.ec2_cohort; the spec is validated first. Without
    --runtime-url or --runtime-pip the instance runs `pip install calque==<this version>`, which
    needs an index that has calque.
    """
    from calque.pool.bootstrap import worker_user_data
    from calque.pool.spec import load_spec

    text = worker_user_data(
        load_spec(spec_path),
        runtime_pip=runtime_pip or None,
        runtime_url=runtime_url or None,
        runtime_sha256=runtime_sha256 or None,
    )
    click.echo(text, nl=False)


# -- submit / results -----------------------------------------------------------------------------

bucket_option = click.option(
    "--bucket", envvar="CALQUE_POOL_BUCKET", default=None, help="The pool's S3 bucket (or CALQUE_POOL_BUCKET)."
)
prefix_option = click.option("--prefix", default="calque", show_default=True, help="Key prefix in the bucket.")


def _target(
    model: str, bucket: str | None, prefix: str, region: str | None, endpoint: str | None, profile: str | None
) -> PoolTarget:
    if not bucket:
        raise UsageError("no bucket: pass --bucket or set CALQUE_POOL_BUCKET to the pool's S3 bucket")
    return PoolTarget(model, bucket, prefix, region, endpoint, profile)


def _render_report(r: RunReport) -> str:
    ips = "-" if r.items_per_second is None else f"{r.items_per_second:.2f}"
    lines = [
        f"run {r.run_id}  model {r.model}  queue {r.queue_name}",
        f"items: {r.items_ok} ok, {r.items_failed} failed of {r.items}  "
        f"claims: {r.claims_done}/{r.claims} done ({r.claims_failed} failed)",
        f"warm hits: {r.warm_hits}/{r.claims_done}  enter paid: {r.enter_seconds_paid:.2f}s  "
        f"wall: {r.wall_seconds:.2f}s  items/s: {ips}",
        cost_line(r.cost, r.enter_seconds_paid),
    ]
    lines += [f"claim error: {e}" for e in r.errors]
    return "\n".join(lines)


def _render_record(r: RunRecord) -> str:
    return f"run {r.run_id}: {r.item_count} items in {len(r.claims)} claims sent to {r.queue_name}"


@pool.command()
@click.option("--model", required=True, help="The pool's model (its identity).")
@click.option("--items", "items_path", required=True, type=click.Path(dir_okay=False), help="JSONL, one item a line.")
@click.option("--method", default=None, help="Method to call (default: the pool's default method).")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=10, show_default=True, help="Items per claim.")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait for the run to finish.")
@click.option("--timeout", type=float, default=3600.0, show_default=True, help="Seconds to wait.")
@click.option("--workload-digest", default=None, help="Refuse workers that run another script/parameters.")
@bucket_option
@prefix_option
@aws_options
@json_option
def submit(
    model: str,
    items_path: str,
    method: str | None,
    batch_size: int,
    wait: bool,
    timeout: float,
    workload_digest: str | None,
    bucket: str | None,
    prefix: str,
    region: str | None,
    endpoint_url: str | None,
    profile: str | None,
    as_json: bool,
) -> None:
    """Submit items to a pool; with --wait, show progress and print the run's outcome and cost.

    Exit 0 when every item succeeded, 1 when some failed, 3 when the pool could not serve the run.
    """
    target = _target(model, bucket, prefix, region, endpoint_url, profile)
    items = core.read_items(Path(items_path))
    record = core.submit(target, items, method=method, batch_size=batch_size, workload_digest=workload_digest)
    click.echo(f"submitted {_render_record(record)}", err=True)
    if not wait:
        emit(record, as_json, _render_record)
        return
    store = target.store(record.queue_name)
    rep = _wait_with_progress(store, record, timeout, target.queue())
    emit(rep, as_json, _render_report)
    core.check_finished(rep, timeout)
    if rep.items_failed or rep.claims_failed:
        raise PartialFailure(
            f"{rep.items_failed} of {rep.items} items failed; see them with: calque pool results {rep.run_id} "
            f"--model {model!r} --failed"
        )


def _wait_with_progress(store: RunStore, record: RunRecord, timeout: float, queue: PoolQueue) -> RunReport:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn("claims"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True
    ) as bar:
        task = bar.add_task("claims", total=len(record.claims))

        def on_progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        rep: RunReport = core.wait(store, record, timeout_s=timeout, on_progress=on_progress, queue=queue)
    return rep


@pool.command()
@click.argument("run_id")
@click.option("--model", required=True, help="The pool's model (its identity).")
@click.option("--failed", "failed_only", is_flag=True, help="Only the items that failed.")
@bucket_option
@prefix_option
@aws_options
def results(
    run_id: str,
    model: str,
    failed_only: bool,
    bucket: str | None,
    prefix: str,
    region: str | None,
    endpoint_url: str | None,
    profile: str | None,
) -> None:
    """Print a run's ItemResults as JSONL on stdout, in item order."""
    target = _target(model, bucket, prefix, region, endpoint_url, profile)
    store, record = core.load_run(target, run_id)
    with contextlib.suppress(InfrastructureError):  # the queue may be gone; its runs' results stay readable
        settle_dead_letters(target.queue(), store)
    out = core.results(store, record)
    shown = [r for r in out if not r.ok] if failed_only else out
    for r in shown:
        sys.stdout.write(r.model_dump_json() + "\n")
    sys.stdout.flush()
    missing = record.item_count - len(out)
    if missing:
        raise InfrastructureError(f"{missing} of {record.item_count} items of run {run_id} have no result yet")


@pool.command()
@click.argument("run_id")
@click.option("--model", required=True, help="The pool's model (its identity).")
@click.option("--dry-run", is_flag=True, help="Only list the orphaned results objects.")
@bucket_option
@prefix_option
@aws_options
def sweep(
    run_id: str,
    model: str,
    dry_run: bool,
    bucket: str | None,
    prefix: str,
    region: str | None,
    endpoint_url: str | None,
    profile: str | None,
) -> None:
    """Delete a run's orphaned results: objects no Summary vouches for (attempts that lost their lease).

    Prints each one's URI. Claims without a Summary yet are left alone.
    """
    target = _target(model, bucket, prefix, region, endpoint_url, profile)
    store, record = core.load_run(target, run_id)
    for uri in store.sweep(record, dry_run=dry_run):
        click.echo(uri)


@pool.command()
@click.option("--model", required=True, help="The pool's model (its identity).")
@click.option("--run", "run_id", default=None, help="Also show this run: items ok and failed, failed claims' reasons.")
@bucket_option
@prefix_option
@aws_options
@json_option
def status(
    model: str,
    run_id: str | None,
    bucket: str | None,
    prefix: str,
    region: str | None,
    endpoint_url: str | None,
    profile: str | None,
    as_json: bool,
) -> None:
    """Show a pool queue's depth: visible, in flight, delayed, dead-lettered, oldest message age.

    With --run, the run's report too (dead-lettered claims of the pool are first recorded as failed).
    """
    sqs = client("sqs", region=region, endpoint_url=endpoint_url, profile=profile)
    cloudwatch = client("cloudwatch", region=region, endpoint_url=endpoint_url, profile=profile)
    queue = PoolQueue(sqs, model, cloudwatch=cloudwatch)
    if run_id is None:
        emit(queue.depth(), as_json, _render_depth)
        return
    target = _target(model, bucket, prefix, region, endpoint_url, profile)
    store, record = core.load_run(target, run_id)
    settle_dead_letters(queue, store)
    emit(core.report(record, store.summaries(record.results_prefix)), as_json, _render_report)


# -- stage-runtime --------------------------------------------------------------------------------


def _render_staged(staged: dict[str, object]) -> str:
    state = "uploaded" if staged["uploaded"] else "already staged"
    return f"s3://{staged['bucket']}/{staged['key']} ({state})\nsha256 {staged['sha256']}\n{staged['url']}"


@pool.command("stage-runtime")
@bucket_option
@prefix_option
@click.option(
    "--ttl",
    default="3h",
    show_default=True,
    help="How long the instances may download it (their TTL): seconds or 90m, 3h, 1d; at most 7 days.",
)
@click.option(
    "--wheel",
    "wheel_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Stage this calque wheel instead of building the running calque's.",
)
@aws_options
@json_option
def stage_runtime(
    bucket: str | None,
    prefix: str,
    ttl: str,
    wheel_path: str | None,
    region: str | None,
    endpoint_url: str | None,
    profile: str | None,
    as_json: bool,
) -> None:
    """Stage this calque's wheel in the pool's bucket (<prefix>/runtime/) and print a presigned URL for it.

    Uploads only when the stored sha256 differs. Pass the URL and sha256 to `calque pool user-data`
    (--runtime-url, --runtime-sha256): instances download, check and pip install the wheel.
    """
    from calque.models.acquire import parse_duration
    from calque.pool.runtime_wheel import stage_runtime as stage

    if not bucket:
        raise UsageError("no bucket: pass --bucket or set CALQUE_POOL_BUCKET to the pool's S3 bucket")
    try:
        ttl_s = parse_duration(ttl, what="--ttl")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    staged = stage(
        bucket, prefix, ttl_s=ttl_s, wheel=wheel_path, region=region, endpoint_url=endpoint_url, profile=profile
    )
    emit(asdict(staged), as_json, _render_staged)
