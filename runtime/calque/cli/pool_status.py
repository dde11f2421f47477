"""``calque pool status``: a pool queue's depth and, for a named pool, its group's size against its backlog."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from calque.cli.options import aws_options, json_option
from calque.cli.output import emit, table
from calque.errors import UsageError

if TYPE_CHECKING:
    from calque.aws.acquire.scaling import ScalingStatus
    from calque.models import QueueDepth


def _render_depth(d: QueueDepth) -> str:
    age = "-" if d.oldest_message_age_s is None else f"{d.oldest_message_age_s}s"
    return table(
        ["queue", "visible", "in flight", "delayed", "dlq", "oldest"],
        [[d.queue_name, d.visible, d.in_flight, d.delayed, d.dlq_visible, age]],
    )


def _render_scaling(s: ScalingStatus) -> str:
    if not s.group_exists:
        group = f"group {s.group_name}: none (calque.gpu.pool_group creates it)"
    else:
        per = "-" if s.backlog_per_instance is None else f"{s.backlog_per_instance:g}"
        target = "-" if s.target is None else f"{s.target:g}"
        group = table(
            ["group", "min", "max", "desired", "in service", "backlog", "per instance", "target"],
            [[s.group_name, s.min_size, s.max_size, s.desired, s.in_service, s.backlog, per, target]],
        )
    return f"pool {s.pool}\n{group}\n{_render_depth(s.queue)}"


@click.command()
@click.option("--model", default=None, help="The pool's model: the queue of a pool named by its model alone.")
@click.option("--pool", "pool_name", default=None, help="The pool's name (lab-a/embedder): queue, group and scaling.")
@aws_options
@json_option
def status(
    model: str | None,
    pool_name: str | None,
    region: str | None,
    endpoint_url: str | None,
    profile: str | None,
    as_json: bool,
) -> None:
    """Show a pool queue's depth; with --pool also its group: desired, in service, backlog per instance, target."""
    from calque.aws.clients import client
    from calque.aws.queue import PoolQueue

    if (model is None) == (pool_name is None):
        raise UsageError("give one of --pool (a named pool, e.g. lab-a/embedder) or --model (a model-named pool)")
    sqs = client("sqs", region=region, endpoint_url=endpoint_url, profile=profile)
    cloudwatch = client("cloudwatch", region=region, endpoint_url=endpoint_url, profile=profile)
    if model is not None:
        emit(PoolQueue(sqs, model, cloudwatch=cloudwatch).depth(), as_json, _render_depth)
        return
    from calque.aws.acquire.scaling import PoolScaling, scaling_status
    from calque.aws.pool_names import pool_names

    try:
        names = pool_names(pool_name or "")
    except ValueError as exc:
        raise UsageError(f"--pool: {exc}") from None
    depth = PoolQueue(sqs, names.pool, names.queue, cloudwatch=cloudwatch).depth()
    autoscaling = client("autoscaling", region=region, endpoint_url=endpoint_url, profile=profile)
    emit(scaling_status(PoolScaling(autoscaling, cloudwatch, names), depth), as_json, _render_scaling)
