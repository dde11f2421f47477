"""``calque pool list`` finds named pools by their calque:pool tag; ``--pool`` names the queue a command uses."""

from __future__ import annotations

import json
from typing import Any

from calque.cli.main import cli
from calque.ops.base import AwsSession
from calque.ops.pool_group import PoolGroupOp, PoolGroupRequest
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


def test_status_with_pool_reads_the_named_pools_queue_not_the_models(moto: str) -> None:
    PoolQueueOp(AwsSession()).run(PoolQueueRequest(model="BAAI/bge", pool="lab-a/embedder"))
    named = CliRunner().invoke(cli, ["pool", "status", "--model", "BAAI/bge", "--pool", "lab-a/embedder", "--json"])
    assert named.exit_code == 0, named.output
    assert json.loads(named.output)["queue"]["queue_name"].startswith("calque-lab-a-embedder-")  # beside its group
    by_model = CliRunner().invoke(cli, ["pool", "status", "--model", "BAAI/bge"])
    assert by_model.exit_code != 0 and "no pool queue" in str(by_model.exception)
    bad = CliRunner().invoke(cli, ["pool", "status", "--model", "m", "--pool", "Lab A"])
    assert bad.exit_code != 0 and "pool name 'Lab A' is not valid" in bad.output
