"""``calque pool status``: a pool's queue, its workers' load records and, for a named pool, its group; or one run."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from calque.cli.options import aws_options, bucket_option, json_option, prefix_option
from calque.cli.output import emit, table, to_json

if TYPE_CHECKING:
    from calque.models.pool_views import DepthView, LoadView, ScalingStatusView


def _render_depth(d: DepthView) -> str:
    age = "-" if d.oldest_message_age_s is None else f"{d.oldest_message_age_s}s"
    return table(
        ["queue", "visible", "in flight", "delayed", "dlq", "oldest"],
        [[d.queue_name, d.visible, d.in_flight, d.delayed, d.dlq_visible, age]],
    )


def _render_group(s: ScalingStatusView) -> str:
    if not s.group_exists:
        return f"group {s.group_name}: none (calque.gpu.pool_group creates it)"
    per = "-" if s.backlog_per_instance is None else f"{s.backlog_per_instance:g}"
    target = "-" if s.target is None else f"{s.target:g}"
    return table(
        ["group", "min", "max", "desired", "in service", "backlog", "per instance", "target"],
        [[s.group_name, s.min_size, s.max_size, s.desired, s.in_service, s.backlog, per, target]],
    )


def _render_scaling(s: ScalingStatusView) -> str:
    return f"pool {s.pool}\n{_render_group(s)}\n{_render_depth(s.queue)}"


def _render_workers(workers: list[LoadView], load_error: str | None) -> str:
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    rows = []
    for r in workers:
        what = ", ".join(r.methods) if r.state == "serving" else (r.error or "-")
        if r.state == "failed" and r.failures > 1:
            what = f"{what} ({r.failures} in a row)"
        rows.append([r.slot, r.worker_id, r.state, f"{int((now - r.seen_at).total_seconds())}s ago", what])
    parts = [table(["slot", "worker", "state", "seen", "methods / error"], rows)] if rows else []
    if not rows:
        parts.append("no worker has recorded a load yet")
    if load_error:
        parts.append(f"load error: {load_error}")
    return "\n\n".join(parts)


@click.command()
@click.option("--model", default=None, help="The pool's model (alone: the queue of a pool named by its model).")
@click.option("--pool", "pool_name", default=None, help="The pool's name (lab-a/embedder): queue, group and scaling.")
@click.option(
    "--run", "run_id", default=None, help="Show this run instead: items ok and failed, failed claims' reasons."
)
@bucket_option
@prefix_option
@aws_options
@json_option
def status(
    model: str | None,
    pool_name: str | None,
    run_id: str | None,
    bucket: str | None,
    prefix: str,
    region: str | None,
    endpoint_url: str | None,
    profile: str | None,
    as_json: bool,
) -> None:
    """Show a pool queue's depth (visible, in flight, delayed, dead-lettered, oldest message age) and its workers.

    With --pool, the pool's group too: min, max, desired and in-service instances, the backlog per
    instance and the scaling target beside it. With a bucket (--bucket or CALQUE_POOL_BUCKET), each
    worker slot's load record: serving (with its methods), stopped, or failed (with the error), and
    the load error when no worker serves. With --run, the run's report instead (dead-lettered
    claims are first recorded as failed).
    """
    from calque.pool.submitter.status import PoolAddress, run_status
    from calque.pool.submitter.status import status as read_status

    if pool_name is not None:
        from calque.models.pool_names import check_pool_name

        try:
            check_pool_name(pool_name)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--pool") from None
    address = PoolAddress(model, pool_name, bucket, prefix, region, endpoint_url, profile)
    if run_id is not None:
        from calque.cli.pool_runs import render_report

        run = run_status(address, run_id)
        emit(run.report, as_json, render_report)
        if run.load_error is not None:
            click.echo(str(run.load_error), err=True)
        return
    view = read_status(address)
    if as_json:
        click.echo(to_json(view.document()))
        return
    parts = [] if view.group is None else [_render_scaling(view.group)]
    if view.group is None:
        parts.append(_render_depth(view.depth))
    if view.workers is not None:
        parts.append(_render_workers(view.workers, view.load_error))
    click.echo("\n\n".join(parts))
