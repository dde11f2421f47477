"""``calque pool list`` finds named pools by their calque:pool tag; ``--pool`` names the queue a command uses."""

from __future__ import annotations

import json
from typing import Any

from calque.aws.acquire import Acquirer, Consent
from calque.cli.main import cli
from calque.ops.base import AwsSession
from calque.ops.pool_group import PoolGroupOp
from calque.ops.pool_group_models import PoolGroupRequest
from calque.ops.pool_queue import PoolQueueOp, PoolQueueRequest
from click.testing import CliRunner

from .conftest import AL2023, Network


def test_pool_list_shows_each_labs_pool_with_its_group_and_queue(network: Network) -> None:
    aws = AwsSession()
    for pool, count in (("lab-a/embedder", 2), ("lab-b/embedder", 1)):
        PoolQueueOp(aws).run(PoolQueueRequest(model="BAAI/bge", pool=pool))
        req: dict[str, Any] = {"pool": pool, "count": count, "instance_types": ["g6.xlarge"]}
        req |= {"subnets": network.subnets, "ami_ssm_parameter": AL2023, "i_understand_this_spends_money": True}
        PoolGroupOp(aws).run(PoolGroupRequest(**req))
    PoolQueueOp(aws).run(PoolQueueRequest(model="legacy/model"))  # a model-named queue: no tag, not listed
    out = CliRunner().invoke(cli, ["pool", "list", "--json"])
    assert out.exit_code == 0, out.output
    pools = json.loads(out.output)["pools"]
    assert [(p["pool"], p["desired"], p["in_service"]) for p in pools] == [
        ("lab-a/embedder", 2, 2),
        ("lab-b/embedder", 1, 1),
    ]
    assert all(p["queue"] and p["group"] for p in pools)
    human = CliRunner().invoke(cli, ["pool", "list"])
    assert "lab-a/embedder" in human.output and "2/2" in human.output


def test_pool_list_shows_a_pool_of_fixed_instances_by_its_cohort_beside_the_groups(
    network: Network, acquirer: Acquirer, spec_for: Any
) -> None:
    """A pool with no group (ec2_cohort with pool:, as calque ramp launches one) is listed by its cohort."""
    aws = AwsSession()
    PoolQueueOp(aws).run(PoolQueueRequest(model="BAAI/bge", pool="lab-a/embedder"))
    req: dict[str, Any] = {"pool": "lab-a/embedder", "count": 1, "instance_types": ["g6.xlarge"]}
    req |= {"subnets": network.subnets, "ami_ssm_parameter": AL2023, "i_understand_this_spends_money": True}
    PoolGroupOp(aws).run(PoolGroupRequest(**req))
    PoolQueueOp(aws).run(PoolQueueRequest(model="Qwen/Qwen3", pool="lab-c/fixed"))
    spend = Consent(spend=True)
    acquirer.apply(spec_for(name="lab-c-fixed", count=2, pool="lab-c/fixed"), spend)
    acquirer.apply(spec_for(name="lab-d-solo", count=1, pool="lab-d/solo"), spend)  # no queue yet
    acquirer.apply(spec_for(name="scratch", count=1), spend)  # a cohort of no pool: not listed
    out = CliRunner().invoke(cli, ["pool", "list", "--json"])
    assert out.exit_code == 0, out.output
    pools = {p["pool"]: p for p in json.loads(out.output)["pools"]}
    assert sorted(pools) == ["lab-a/embedder", "lab-c/fixed", "lab-d/solo"]
    fixed = pools["lab-c/fixed"]
    assert (fixed["cohort"], fixed["running"], fixed["group"]) == ("lab-c-fixed", 2, None)
    assert fixed["queue"] and fixed["queue"].startswith("calque-lab-c-fixed-")
    solo = pools["lab-d/solo"]
    assert (solo["cohort"], solo["running"], solo["queue"]) == ("lab-d-solo", 1, None)
    group = pools["lab-a/embedder"]  # a group's instances are the group's: no cohort for them
    assert (group["cohort"], group["running"], group["desired"], group["in_service"]) == (None, None, 1, 1)
    human = CliRunner().invoke(cli, ["pool", "list"])
    assert human.exit_code == 0, human.output
    line = next(x for x in human.output.splitlines() if x.startswith("lab-c/fixed"))
    assert "cohort lab-c-fixed" in line and "2 running" in line and fixed["queue"] in line, human.output
    assert "group calque-lab-a-embedder-" in human.output, human.output
    # a cohort ended is no longer a pool here
    acquirer.release("lab-c-fixed", Consent(terminate=True), wait=True, wait_timeout_s=60)
    after = CliRunner().invoke(cli, ["pool", "list", "--json"])
    left = {p["pool"]: p for p in json.loads(after.output)["pools"]}
    assert left["lab-c/fixed"]["cohort"] is None and left["lab-c/fixed"]["queue"] == fixed["queue"], after.output


def test_status_with_pool_reads_the_named_pools_queue_not_the_models(moto: str) -> None:
    PoolQueueOp(AwsSession()).run(PoolQueueRequest(model="BAAI/bge", pool="lab-a/embedder"))
    named = CliRunner().invoke(cli, ["pool", "status", "--model", "BAAI/bge", "--pool", "lab-a/embedder", "--json"])
    assert named.exit_code == 0, named.output
    assert json.loads(named.output)["queue"]["queue_name"].startswith("calque-lab-a-embedder-")  # beside its group
    by_model = CliRunner().invoke(cli, ["pool", "status", "--model", "BAAI/bge"])
    assert by_model.exit_code != 0 and "no pool queue" in str(by_model.exception)
    bad = CliRunner().invoke(cli, ["pool", "status", "--model", "m", "--pool", "Lab A"])
    assert bad.exit_code != 0 and "pool name 'Lab A' is not valid" in bad.output
