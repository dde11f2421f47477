"""``calque pool ...``: warm pools: submit runs, read results, run workers, look at queues."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from calque.cli.options import (
    DURATION,
    aws_options,
    bucket_option,
    given_pool_queue,
    json_option,
    pool_name_option,
    prefix_option,
)
from calque.cli.output import emit
from calque.cli.pool_scaling import scaling
from calque.cli.pool_status import status
from calque.errors import InfrastructureError, PartialFailure, UsageError

# boto3, the pool models and pydantic load when a command runs, not for --help (bench/cli_startup.py).
if TYPE_CHECKING:
    from calque.aws.store import RunStore
    from calque.models import RunRecord, RunReport
    from calque.ops.outcome import Outcome
    from calque.pool.submit import PoolTarget


@click.group()
def pool() -> None:
    """Warm pools: one SQS queue per named pool and resident workers that keep its model loaded."""


pool.add_command(status)
pool.add_command(scaling)


def _render_queue(o: Outcome[Any]) -> str:
    r = o.result
    attrs = ", ".join(f"{k}={v}" for k, v in r.attributes.items()) or "-"
    return f"queue {r.queue_name}  url {r.queue_url or '-'}\ndlq {r.dlq_arn or '-'}\nattributes {attrs}"


@pool.command()
@click.option("--model", required=True, help="The pool's model (its identity).")
@click.option("--pool", default=None, help="The pool's name (lab-a/embedder): names and tags the queue.")
@click.option("--state", type=click.Choice(["present", "absent"]), default="present", show_default=True)
@click.option("--visibility-timeout", type=int, default=None, help="Seconds a claim stays invisible (0..43200).")
@click.option("--message-retention", type=int, default=None, help="Seconds SQS keeps a message (60..1209600).")
@click.option("--receive-wait", type=int, default=None, help="Long-poll wait in seconds (0..20).")
@click.option("--max-receive-count", type=int, default=None, help="Receives before the DLQ (1..1000).")
@click.option("--dlq-retention", type=int, default=None, help="Seconds the DLQ keeps a message (60..1209600).")
@click.option("--encryption/--no-encryption", default=None, help="SQS-managed server-side encryption.")
@click.option("--check", is_flag=True, help="Show what would change, change nothing.")
@aws_options
@json_option
def queue(
    check: bool, region: str | None, endpoint_url: str | None, profile: str | None, as_json: bool, **options: Any
) -> None:
    """Create, update or delete a pool's SQS queue and dead-letter queue (as calque.gpu.pool_queue does).

    Settings left out keep an existing queue's values; a new queue gets the defaults.
    """
    from calque.cli.outcome import emit_outcome
    from calque.ops.base import AwsSession
    from calque.ops.pool_queue import PoolQueueOp

    op = PoolQueueOp(AwsSession(region=region, endpoint_url=endpoint_url, profile=profile))
    emit_outcome(op.run(op.request(options), check_mode=check), as_json, _render_queue)


# -- worker ---------------------------------------------------------------------------------------


@pool.command()
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False), help="PoolSpec file (YAML).")
@click.option("--index", type=int, default=None, help="Run only worker N of the spec (systemd template units).")
@click.option("--idle-timeout", type=DURATION, default=None, help="Override: exit after this long idle (600, 10m).")
@click.option("--metrics-port", type=int, default=None, help="Override: serve Prometheus metrics on PORT.")
@click.option("--metrics-addr", default=None, help="Override: the address the metrics port binds (default 127.0.0.1).")
@click.option("--metrics-textfile", default=None, help="Override: write metrics to this node_exporter .prom file.")
@click.option("--instance-type", default=None, help="Override: the EC2 instance type (for the cost line).")
@click.option("--imds-endpoint", default=None, help="Override: the instance metadata service address.")
def worker(
    spec_path: str,
    index: int | None,
    idle_timeout: float | None,
    metrics_port: int | None,
    metrics_addr: str | None,
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
        metrics_addr=metrics_addr,
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
    "--wheelhouse-url",
    default=None,
    help="Presigned URL of the staged wheelhouse (calque and its pinned dependencies); needs --wheelhouse-sha256.",
)
@click.option("--wheelhouse-sha256", default=None, help="The staged wheelhouse's sha256, checked on the instance.")
@click.option(
    "--runtime-pip",
    default=None,
    help="Override: pip requirement or URL that installs calque on the instance (wins over --runtime-url).",
)
@json_option
def user_data(
    spec_path: str,
    runtime_url: str | None,
    runtime_sha256: str | None,
    wheelhouse_url: str | None,
    wheelhouse_sha256: str | None,
    runtime_pip: str | None,
    as_json: bool,
) -> None:
    """Print the EC2 user-data that makes an instance a worker of this pool (systemd unit included).

    playbooks/pool.yml passes it to calque.gpu.ec2_cohort; the spec is validated first. Without
    --runtime-url or --runtime-pip the instance runs `pip install calque==<this version>`, which
    needs an index that has calque. With --wheelhouse-url the instance installs calque and exactly
    the dependency versions in constraints.txt from the staged wheelhouse, with no index.
    """
    from calque.cli.outcome import emit_outcome
    from calque.ops.pool_spec import PoolSpecOp, PoolSpecRequest
    from calque.pool.spec import load_spec

    request = PoolSpecRequest(
        spec=load_spec(spec_path).model_dump(mode="json"),
        stage_runtime=False,
        runtime_pip=runtime_pip or None,
        runtime_url=runtime_url or None,
        runtime_sha256=runtime_sha256 or None,
        wheelhouse_url=wheelhouse_url or None,
        wheelhouse_sha256=wheelhouse_sha256 or None,
    )
    outcome = PoolSpecOp().run(request)
    if as_json:
        emit_outcome(outcome, as_json)
    else:  # the human view is the script itself, to pipe or save
        click.echo(outcome.result.user_data, nl=False)


# -- submit / results -----------------------------------------------------------------------------


def _target(
    model: str, bucket: str | None, prefix: str, region: str | None, endpoint: str | None, profile: str | None
) -> PoolTarget:
    from calque.pool.submit import PoolTarget

    if not bucket:
        raise UsageError("no bucket: pass --bucket or set CALQUE_POOL_BUCKET to the pool's S3 bucket")
    return PoolTarget(model, bucket, prefix, region, endpoint, profile, given_pool_queue())


def _render_report(r: RunReport) -> str:
    from calque.pool.cost import cost_line

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
@click.option(
    "--timeout", type=DURATION, default=3600.0, show_default=True, help="How long to wait (seconds, 90m, 1h)."
)
@click.option("--workload-digest", default=None, help="Refuse workers that run another script/parameters.")
@pool_name_option
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
    from calque.pool import submit as core

    target = _target(model, bucket, prefix, region, endpoint_url, profile)
    items = core.read_items(Path(items_path))
    record = core.submit(target, items, method=method, batch_size=batch_size, workload_digest=workload_digest)
    click.echo(f"submitted {_render_record(record)}", err=True)
    if not wait:
        emit(record, as_json, _render_record)
        return
    store = target.store(record.queue_name)
    rep = _wait_with_progress(store, record, timeout)
    emit(rep, as_json, _render_report)
    core.check_finished(rep, timeout)
    if rep.items_failed or rep.claims_failed:
        raise PartialFailure(
            f"{rep.items_failed} of {rep.items} items failed; see them with: calque pool results {rep.run_id} "
            f"--model {model!r} --failed"
        )


def _wait_with_progress(store: RunStore, record: RunRecord, timeout: float) -> RunReport:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from calque.pool import submit as core

    console = Console(stderr=True)
    with Progress(
        TextColumn("claims"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True
    ) as bar:
        task = bar.add_task("claims", total=len(record.claims))

        def on_progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        rep: RunReport = core.wait(store, record, timeout_s=timeout, on_progress=on_progress)
    return rep


@pool.command()
@click.argument("run_id")
@click.option("--model", required=True, help="The pool's model (its identity).")
@click.option("--failed", "failed_only", is_flag=True, help="Only the items that failed.")
@pool_name_option
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
    from calque.pool import submit as core

    target = _target(model, bucket, prefix, region, endpoint_url, profile)
    store, record = core.load_run(target, run_id)
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
@pool_name_option
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
    from calque.pool import submit as core

    target = _target(model, bucket, prefix, region, endpoint_url, profile)
    store, record = core.load_run(target, run_id)
    for uri in store.sweep(record, dry_run=dry_run):
        click.echo(uri)


# Verbs in their own files (each file under a few hundred lines).
from calque.cli.pool_iam import iam_policy  # noqa: E402
from calque.cli.pool_list import pool_list  # noqa: E402
from calque.cli.pool_runtime import stage_runtime  # noqa: E402

pool.add_command(pool_list)
pool.add_command(stage_runtime)
pool.add_command(iam_policy)
