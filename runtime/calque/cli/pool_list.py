"""``calque pool list``: the named pools of a region (groups and cohorts), found by their calque:pool tag."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from calque.cli.options import aws_options, json_option
from calque.cli.output import emit, table

if TYPE_CHECKING:
    from calque.aws.acquire.named_pools import PoolList


def _render(pools: PoolList) -> str:
    if not pools.pools:
        return "no named pools here (a pool named by its model only: calque pool status --model ...)"
    dash = "-"
    rows = []
    for p in pools.pools:
        if p.group is not None:
            kind, instances = f"group {p.group}", dash if p.desired is None else f"{p.in_service}/{p.desired}"
            size = dash if p.max_size is None else f"{p.min_size}..{p.max_size}"
        elif p.cohort is not None:
            kind, instances, size = f"cohort {p.cohort}", f"{p.running} running", dash
        else:
            kind, instances, size = dash, dash, dash
        rows.append([p.pool, kind, instances, size, p.queue or dash])
    return table(["pool", "group / cohort", "in service/desired", "size", "queue"], rows)


@click.command("list")
@aws_options
@json_option
def pool_list(region: str | None, endpoint_url: str | None, profile: str | None, as_json: bool) -> None:
    """List the named pools in an account and region: a group's size and instances in service, a cohort's
    running instances (a pool of fixed instances, calque.gpu.ec2_cohort with pool:), the queue."""
    from calque.aws.acquire.named_pools import list_named_pools

    emit(list_named_pools(region=region, endpoint_url=endpoint_url, profile=profile), as_json, _render)
