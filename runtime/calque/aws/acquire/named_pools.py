"""The named pools of an account and region, found by their ``calque:pool`` tag (``calque pool list``).

A pool shows up when its Auto Scaling group, its queue or its instances carry the tag: a pool with a
group (``calque.gpu.pool_group``), and a pool with no group, a cohort of fixed instances launched by
``calque.gpu.ec2_cohort`` with ``pool: POOL`` (each instance tagged ``calque:pool`` and
``calque:cohort``), as ``calque ramp`` launches its instance. A pool made before named pools (a queue
named by its model, no tag) does not, and is listed with ``calque pool status --model``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import Field

from calque.aws.acquire.group import pool_groups
from calque.aws.acquire.launch_spec import TAG_COHORT
from calque.aws.aws_errors import aws_errors
from calque.aws.clients import LazyClient
from calque.models.base import CalqueModel
from calque.models.pool_names import POOL_TAG


class PoolEntry(CalqueModel):
    """One named pool as AWS has it: its group, or its cohort of fixed instances, and its queue."""

    pool: str
    group: str | None = None
    min_size: int | None = None
    max_size: int | None = None
    desired: int | None = None
    in_service: int | None = None
    cohort: str | None = Field(None, description="the calque:cohort of the pool's fixed instances (no group)")
    running: int | None = Field(None, description="the cohort's instances pending or running")
    queue: str | None = None
    queue_url: str | None = None


class PoolList(CalqueModel):
    version: int = 1
    pools: list[PoolEntry] = Field(default_factory=list)


def pool_of(resource: dict[str, Any]) -> str | None:
    """The value of a resource's ``calque:pool`` tag (an instance's, a group's), None without one."""
    return next((t["Value"] for t in resource.get("Tags", []) if t["Key"] == POOL_TAG), None)


def tagged_instances(ec2: Any, pool: str | None) -> list[dict[str, Any]]:
    """Pending or running instances tagged ``calque:pool`` (``=pool`` when given), newest first."""
    tag = {"Name": f"tag:{POOL_TAG}", "Values": [pool]} if pool else {"Name": "tag-key", "Values": [POOL_TAG]}
    found: list[dict[str, Any]] = []
    with aws_errors(f"describe the instances of pool {pool}" if pool else "describe the instances of pools"):
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[tag, {"Name": "instance-state-name", "Values": ["pending", "running"]}]
        )
        for page in pages:
            for res in page.get("Reservations", []):
                found += [i for i in res.get("Instances", []) if pool is None or pool_of(i) == pool]
    return sorted(found, key=lambda i: (i["LaunchTime"], i["InstanceId"]), reverse=True)


def _group_entries(asg: Any) -> list[PoolEntry]:
    return [
        PoolEntry(
            pool=name,
            group=g["AutoScalingGroupName"],
            min_size=int(g["MinSize"]),
            max_size=int(g["MaxSize"]),
            desired=int(g["DesiredCapacity"]),
            in_service=sum(1 for i in g.get("Instances", []) if i.get("LifecycleState") == "InService"),
        )
        for g in pool_groups(asg)
        if (name := pool_of(g))
    ]


def _cohort_entries(ec2: Any) -> list[PoolEntry]:
    """A pool's fixed instances by cohort (an instance a group launched carries no ``calque:cohort``)."""
    counts: dict[tuple[str, str], int] = {}
    for inst in tagged_instances(ec2, None):
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
        if TAG_COHORT in tags:
            key = (tags[POOL_TAG], tags[TAG_COHORT])
            counts[key] = counts.get(key, 0) + 1
    return [PoolEntry(pool=pool, cohort=cohort, running=n) for (pool, cohort), n in sorted(counts.items())]


def _queue_entries(sqs: Any) -> list[tuple[str, str]]:
    """(pool, queue URL) of every tagged pool queue (not the dead-letter queues)."""
    with aws_errors("list the SQS queues of calque pools"):
        urls: list[str] = []
        for page in sqs.get_paginator("list_queues").paginate(QueueNamePrefix="calque-"):
            urls.extend(u for u in page.get("QueueUrls", []) if not u.endswith("-dlq"))
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(urls))), thread_name_prefix="calque-list") as pool:
            tags = list(pool.map(lambda u: sqs.list_queue_tags(QueueUrl=u).get("Tags", {}), urls))
    return [(t[POOL_TAG], url) for url, t in zip(urls, tags, strict=True) if t.get(POOL_TAG)]


def list_pools(asg: Any, sqs: Any, ec2: Any) -> PoolList:
    """Every pool with a tagged group, cohort or queue, by name (a pool of two cohorts: one entry each).

    The three listings are independent reads of three services, made at once."""
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="calque-list") as pool:
        groups, cohorts = pool.submit(_group_entries, asg), pool.submit(_cohort_entries, ec2)
        queues = pool.submit(_queue_entries, sqs)
        by_pool: dict[str, list[PoolEntry]] = {}
        for entry in [*groups.result(), *cohorts.result()]:
            by_pool.setdefault(entry.pool, []).append(entry)
        for name, url in queues.result():
            for entry in by_pool.setdefault(name, [PoolEntry(pool=name)]):
                entry.queue, entry.queue_url = url.rsplit("/", 1)[-1], url
    entries = [e for same in by_pool.values() for e in same]
    return PoolList(pools=sorted(entries, key=lambda e: (e.pool, e.group or "", e.cohort or "")))


def list_named_pools(
    *, region: str | None = None, endpoint_url: str | None = None, profile: str | None = None
) -> PoolList:
    """``calque pool list``: :func:`list_pools` in one account and region, each service's client made on
    the thread that first reads it (the three reads run at once)."""
    where = {"region": region, "endpoint_url": endpoint_url, "profile": profile}
    asg, sqs, ec2 = (LazyClient(service, **where) for service in ("autoscaling", "sqs", "ec2"))
    return list_pools(asg, sqs, ec2)
