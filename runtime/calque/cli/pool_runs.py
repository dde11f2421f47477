"""``calque pool submit|results|sweep``: a pool's runs, from staging to results."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
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
from calque.errors import InfrastructureError, PartialFailure, UsageError

# boto3, the pool models and pydantic load when a command runs, not for --help (bench/cli_startup.py).
if TYPE_CHECKING:
    from calque.models import RunRecord, RunReport
    from calque.pool.submitter.submit import PoolTarget

# -- submit / results -----------------------------------------------------------------------------


def target_of(
    model: str | None,
    bucket: str | None,
    prefix: str,
    region: str | None,
    endpoint_url: str | None,
    profile: str | None,
    spec_path: str | None = None,
) -> PoolTarget:
    """The pool a command means: from ``--spec`` (its model, pool, bucket, prefix, region, endpoint) with
    the flags given on the command line overriding it, or from the flags alone."""
    from click.core import ParameterSource

    from calque.pool.submitter.submit import PoolTarget

    if spec_path is None:
        if not model:
            raise UsageError("no pool: pass --spec FILE (the spec file pool.yml writes) or --model (the pool's model)")
        if not bucket:
            raise UsageError("no bucket: pass --bucket or set CALQUE_POOL_BUCKET to the pool's S3 bucket")
        return PoolTarget(model, bucket, prefix, region, endpoint_url, profile, given_pool_queue())
    from calque.pool.spec import load_spec

    spec = load_spec(spec_path)
    ctx = click.get_current_context()

    def flag(name: str) -> bool:
        return ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE

    return PoolTarget(
        model or spec.model,
        bucket if flag("bucket") and bucket else spec.bucket,
        prefix if flag("prefix") else spec.prefix,
        region or spec.region,
        endpoint_url or spec.endpoint_url,
        profile,
        given_pool_queue() or (spec.queue_name if not model or model == spec.model else None),
    )


# The pool by its spec file: model, pool and bucket come from it (flags given beside it override)
spec_option = click.option(
    "--spec",
    "spec_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="The pool's spec file (pool.yml's calque_pool_spec_path): model, pool, bucket, prefix and region from it.",
)
model_option = click.option("--model", default=None, help="The pool's model (its identity); or give --spec.")


def _again(spec_path: str | None, model: str) -> str:
    """How the hints below name the pool again: as the command was given it."""
    return f"--spec {spec_path}" if spec_path else f"--model {model!r}"


def render_report(r: RunReport) -> str:
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


@click.command()
@spec_option
@model_option
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
    spec_path: str | None,
    model: str | None,
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
    from calque.pool.submitter import submit as core
    from calque.pool.submitter.runs import submit_and_wait

    target = target_of(model, bucket, prefix, region, endpoint_url, profile, spec_path)
    items = core.read_items(Path(items_path))

    def submitted(record: RunRecord) -> None:
        click.echo(f"submitted {_render_record(record)}", err=True)

    if not wait:
        record = core.submit(target, items, method=method, batch_size=batch_size, workload_digest=workload_digest)
        submitted(record)
        emit(record, as_json, _render_record)
        return
    with _claims_bar() as on_progress:
        rep = submit_and_wait(
            target,
            items,
            method=method,
            batch_size=batch_size,
            workload_digest=workload_digest,
            timeout_s=timeout,
            on_submitted=submitted,
            on_progress=on_progress,
        )
    emit(rep, as_json, render_report)
    core.check_finished(rep, timeout)
    if rep.items_failed or rep.claims_failed:
        raise PartialFailure(
            f"{rep.items_failed} of {rep.items} items failed; see them with: calque pool results {rep.run_id} "
            f"{_again(spec_path, target.model)} --failed"
        )


@contextlib.contextmanager
def _claims_bar() -> Iterator[Callable[[int, int], None]]:
    """A transient bar of claims with a Summary on stderr; what it yields takes (done, total)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn("claims"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True
    ) as bar:
        task = bar.add_task("claims", total=None)

        def on_progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield on_progress


@click.command()
@click.argument("run_id")
@spec_option
@model_option
@click.option("--failed", "failed_only", is_flag=True, help="Only the items that failed.")
@pool_name_option
@bucket_option
@prefix_option
@aws_options
def results(run_id: str, failed_only: bool, **pool: Any) -> None:
    """Print a run's ItemResults as JSONL on stdout, in item order."""
    from calque.pool.submitter.runs import settled_results

    target = target_of(**pool)  # the options that name the pool, as target_of takes them
    record, out = settled_results(target, run_id)
    shown = [r for r in out if not r.ok] if failed_only else out
    for r in shown:
        sys.stdout.write(r.model_dump_json() + "\n")
    sys.stdout.flush()
    missing = record.item_count - len(out)
    if missing:
        raise InfrastructureError(f"{missing} of {record.item_count} items of run {run_id} have no result yet")


@click.command()
@click.argument("run_id")
@spec_option
@model_option
@click.option("--dry-run", is_flag=True, help="Only list the orphaned results objects.")
@pool_name_option
@bucket_option
@prefix_option
@aws_options
def sweep(run_id: str, dry_run: bool, **pool: Any) -> None:
    """Delete a run's orphaned results: objects no Summary vouches for (attempts that lost their lease).

    Prints each one's URI. Claims without a Summary yet are left alone.
    """
    from calque.pool.submitter import submit as core

    target = target_of(**pool)
    store, record = core.load_run(target, run_id)
    for uri in store.sweep(record, dry_run=dry_run):
        click.echo(uri)
