"""``calque pool list``: the named pools of an account and region, found by their calque:pool tag."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from calque.cli.options import aws_options, json_option
from calque.cli.output import emit, table

if TYPE_CHECKING:
    from calque.aws.pools import PoolList


def _render(pools: PoolList) -> str:
    if not pools.pools:
        return "no named pools here (a pool named by its model only: calque pool status --model ...)"
    dash = "-"
    rows = [
        [
            p.pool,
            p.group or dash,
            dash if p.desired is None else f"{p.in_service}/{p.desired}",
            dash if p.max_size is None else f"{p.min_size}..{p.max_size}",
            p.queue or dash,
        ]
        for p in pools.pools
    ]
    return table(["pool", "group", "in service/desired", "size", "queue"], rows)


@click.command("list")
@aws_options
@json_option
def pool_list(region: str | None, endpoint_url: str | None, profile: str | None, as_json: bool) -> None:
    """List the named pools in an account and region: group size and instances in service, queue."""
    from calque.aws.clients import client
    from calque.aws.pools import list_pools

    asg = client("autoscaling", region=region, endpoint_url=endpoint_url, profile=profile)
    sqs = client("sqs", region=region, endpoint_url=endpoint_url, profile=profile)
    emit(list_pools(asg, sqs), as_json, _render)
