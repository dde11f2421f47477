"""The named pools of an account and region, found by their ``calque:pool`` tag (``calque pool list``).

A pool shows up when its Auto Scaling group or its queue carries the tag; a pool made before named
pools (a queue named by its model, no tag) does not, and is listed with ``calque pool status --model``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from calque.aws.acquire.group import pool_groups
from calque.aws.errors import aws_errors
from calque.models.base import CalqueModel
from calque.models.pool_names import POOL_TAG


class PoolEntry(CalqueModel):
    """One named pool as AWS has it."""

    pool: str
    group: str | None = None
    min_size: int | None = None
    max_size: int | None = None
    desired: int | None = None
    in_service: int | None = None
    queue: str | None = None
    queue_url: str | None = None


class PoolList(CalqueModel):
    version: int = 1
    pools: list[PoolEntry] = Field(default_factory=list)


def list_pools(asg: Any, sqs: Any) -> PoolList:
    """Every pool with a tagged group or queue, by name."""
    found: dict[str, PoolEntry] = {}
    for g in pool_groups(asg):
        name = next(t["Value"] for t in g.get("Tags", []) if t["Key"] == POOL_TAG)
        found[name] = PoolEntry(
            pool=name,
            group=g["AutoScalingGroupName"],
            min_size=int(g["MinSize"]),
            max_size=int(g["MaxSize"]),
            desired=int(g["DesiredCapacity"]),
            in_service=sum(1 for i in g.get("Instances", []) if i.get("LifecycleState") == "InService"),
        )
    with aws_errors("list the SQS queues of calque pools"):
        urls: list[str] = []
        for page in sqs.get_paginator("list_queues").paginate(QueueNamePrefix="calque-"):
            urls.extend(page.get("QueueUrls", []))
        for url in urls:
            if url.endswith("-dlq"):
                continue
            name = sqs.list_queue_tags(QueueUrl=url).get("Tags", {}).get(POOL_TAG)
            if name:
                entry = found.setdefault(name, PoolEntry(pool=name))
                entry.queue, entry.queue_url = url.rsplit("/", 1)[-1], url
    return PoolList(pools=[found[k] for k in sorted(found)])
