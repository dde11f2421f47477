"""``pool.yml``'s spend gate against the lab's month (``calque.ops.pool_group`` with ``lab_budget``),
on the moto server: every instance of the lab's pools this month counts (from the usage records its
instances write where the group's ``calque:usage`` tag says), another lab's do not, and the lab's
sessions come only through the broker: a lab whose pools it holds for the month is refused
(``lab_spent_elsewhere`` is deprecated and ignored)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from calque.aws.acquire.budget_hold import hold_pool, release_pool
from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.errors import RefusedError
from calque.models.pool_names import pool_names
from calque.ops.base import AwsSession
from calque.ops.pool_group import PoolGroupOp
from calque.ops.pool_group_models import PoolGroupRequest
from calque.pool.worker.usage import InstanceUsage

from .conftest import AL2023, Network
from .test_pool_group import CONSENT


def _request(network: Network, pool: str, **kw: Any) -> PoolGroupRequest:
    base: dict[str, Any] = {
        "pool": pool,
        "count": 2,
        "max_size": 2,
        "instance_types": ["g6.xlarge"],
        "subnets": network.subnets,
        "ami_ssm_parameter": AL2023,
        "user_data": "#!/bin/sh\n",
        "max_hourly_usd": 50,
        **CONSENT,
    }
    return PoolGroupRequest(**{**base, **kw})


def test_the_gate_counts_the_labs_month_and_refuses_once_it_is_spent(network: Network) -> None:
    op = PoolGroupOp(AwsSession())
    client("s3").create_bucket(Bucket="lab-a-other")
    made = op.run(_request(network, "lab-a/other", bucket="lab-a-other")).result
    assert made.desired == 2  # two running g6.xlarge of lab-a, each recording its time up from now
    store = RunStore(client("s3"), "lab-a-other", "calque", PoolQueue(None, "m", pool_names("lab-a/other").queue).name)
    for iid in made.instances:
        InstanceUsage(store, "lab-a/other", iid, "g6.xlarge", "warm-up").beat()

    def gate(pool: str, budget: dict[str, Any], elsewhere: float = 0.0) -> Any:
        return op.plan(_request(network, pool, gate_only=True, lab_budget=budget, lab_spent_elsewhere=elsewhere))

    raiser = "Research Computing <rc@example.edu>"
    assert gate("lab-a/embedder", {"usd": 100, "raised_by": raiser}, 500.0).spend  # deprecated: ignored
    with pytest.raises(RefusedError, match="Research Computing"):
        gate("lab-a/embedder", {"usd": 1e-9, "raised_by": raiser})  # lab-a/other's instances alone spend it
    with pytest.raises(RefusedError, match="GPU-hours budget"):
        gate("lab-a/embedder", {"gpu_hours": 1e-9})
    assert gate("lab-b/x", {"usd": 1e-9})  # lab-a's instances are not lab-b's

    # the broker holds lab-a/other (lab-a's sessions and pools together are over): no new lab-a capacity
    month = time.strftime("%Y-%m", time.gmtime())
    assert hold_pool(client("autoscaling"), "lab-a/other", month).action == "held"
    with pytest.raises(RefusedError, match=r"sessions and pools together \(the broker holds lab-a/other"):
        gate("lab-a/embedder", {"usd": 100, "raised_by": raiser})
    assert release_pool(client("autoscaling"), "lab-a/other").action == "released"
    assert gate("lab-a/embedder", {"usd": 100, "raised_by": raiser}).spend
