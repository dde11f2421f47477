"""``calque pool ...``: warm pools: submit runs, read results, run workers, look at queues."""

from __future__ import annotations

import click

from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.cli.options import aws_options, json_option
from calque.cli.output import emit, table
from calque.models import QueueDepth


@click.group()
def pool() -> None:
    """Warm pools: one SQS queue per model and resident workers that keep the model loaded."""


def _render_depth(d: QueueDepth) -> str:
    age = "-" if d.oldest_message_age_s is None else f"{d.oldest_message_age_s}s"
    return table(
        ["queue", "visible", "in flight", "delayed", "dlq", "oldest"],
        [[d.queue_name, d.visible, d.in_flight, d.delayed, d.dlq_visible, age]],
    )


@pool.command()
@click.option("--model", required=True, help="The pool's model (its identity).")
@aws_options
@json_option
def status(model: str, region: str | None, endpoint_url: str | None, profile: str | None, as_json: bool) -> None:
    """Show a pool queue's depth: visible, in flight, delayed, dead-lettered."""
    sqs = client("sqs", region=region, endpoint_url=endpoint_url, profile=profile)
    emit(PoolQueue(sqs, model).depth(), as_json, _render_depth)
