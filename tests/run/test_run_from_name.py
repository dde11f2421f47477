"""``modal.Cls.from_name``/``Function.from_name``: a deployed pool found by its ``calque:pool`` tag.

The pools are deployed as ``playbooks/pool.yml`` deploys them (the workload staged to S3, a tagged
Auto Scaling group whose launch template's user-data carries the spec), on moto; moto's instances
cannot run the user-data, so a local worker process serves each pool's queue from the same spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from acquire.conftest import AL2023, Network, acquirer, ec2, network, spec_for  # noqa: F401  (fixtures)
from calque.aws.acquire import Acquirer, Consent
from calque.aws.clients import client
from calque.aws.naming import pool_queue_name
from calque.cli.main import run
from calque.models import PoolSpec
from calque.ops.base import AwsSession
from calque.ops.pool_group import PoolGroupOp
from calque.ops.pool_group_models import PoolGroupRequest
from calque.pool.bootstrap import stage_workload, worker_user_data
from pool.conftest import make_pool  # noqa: F401  (the fixture: a queue, a bucket and real workers)

pytestmark = pytest.mark.slow
CORPUS = Path(__file__).resolve().parent / "corpus"
BUCKET = "calque-test-bucket"
CONSENT = {"i_understand_this_spends_money": True, "i_understand_this_terminates_instances": True}
SERVED = """import modal

app = modal.App("deployed")


@app.cls()
class Model:
    @modal.method()
    def double(self, x):
        return 2 * x


@app.function()
def square(x):
    return x * x
"""


def _deploy(make_pool: Any, net: Network, script: Path, target: str, pool: str) -> Any:  # noqa: F811
    model = pool.replace("/", "-")
    s3 = client("s3")
    if BUCKET not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
        s3.create_bucket(Bucket=BUCKET)
    uri = stage_workload(s3, BUCKET, "calque", pool_queue_name(model), f"{script}{target}")
    p = make_pool(workload=uri, model=model, pool=pool, queue_name=pool_queue_name(model))
    req = PoolGroupRequest(pool=pool, count=1, max_size=1, instance_types=["g6.xlarge"], subnets=net.subnets,
                           ami_ssm_parameter=AL2023, user_data=worker_user_data(PoolSpec.model_validate(p.spec)),
                           max_hourly_usd=50, **CONSENT)  # fmt: skip
    assert PoolGroupOp(AwsSession()).run(req).changed
    return p.start()


def test_from_name_finds_a_deployed_pool_by_its_tag(make_pool, network, capsys, tmp_path: Path) -> None:  # noqa: F811
    served = tmp_path / "served.py"
    served.write_text(SERVED)
    workers = [
        _deploy(make_pool, network, served, "::Model", "parity/deployed"),
        _deploy(make_pool, network, served, "::square", "parity/deployed-fn"),
    ]
    for w in workers:
        w.wait_log("serving")
    capsys.readouterr()
    code = run(["run", "--timeout", "180", str(CORPUS / "from_name.py")])  # no --pool: found by name
    out, err = capsys.readouterr()
    assert code == 0, (out, err, [w.stderr() for w in workers])
    assert out == "method 42\nfunction [1, 4, 9]\n"
    assert "on pools parity/deployed, parity/deployed-fn" in err, err
    # --local has no deployed pool's code: it says so
    code = run(["run", "--local", str(CORPUS / "from_name.py")])
    out, err = capsys.readouterr()
    assert code == 2 and "a deployed pool's code; --local runs only this script's own" in err, err


def test_from_name_finds_a_pool_of_fixed_instances_by_their_tag(
    make_pool,  # noqa: F811
    acquirer: Acquirer,  # noqa: F811
    spec_for,  # noqa: F811
    capsys,
) -> None:
    """No group: a cohort launched with the pool's tag and the worker's user-data (as ec2_cohort launches one)."""
    model = "parity-fixed"
    s3 = client("s3")
    if BUCKET not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
        s3.create_bucket(Bucket=BUCKET)
    p = make_pool(workload="", model=model, pool="parity/fixed", queue_name=pool_queue_name(model))
    script = p.tmp / "served.py"
    script.write_text(SERVED)
    p.spec["workload"] = stage_workload(s3, BUCKET, "calque", pool_queue_name(model), f"{script}::Model")
    user_data = worker_user_data(PoolSpec.model_validate(p.spec))
    cohort = acquirer.apply(
        spec_for(name="fixed", count=1, pool="parity/fixed", user_data=user_data), Consent(spend=True)
    )
    assert len(cohort.instances) == 1
    assert not client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"]  # no group: a cohort
    p.start().wait_log("serving")  # moto's instance cannot run its user-data: a local worker, same spec
    capsys.readouterr()
    code = run(["run", "--timeout", "180", str(CORPUS / "from_name_cohort.py")])
    out, err = capsys.readouterr()
    assert code == 0, (out, err, p.workers[0].stderr())
    assert out == "fixed 8 [2, 4]\n" and "on pool parity/fixed" in err, (out, err)
    # another pool's name is still not found, and the message names the pools that are tagged here
    code = run(["run", str(CORPUS / "from_name.py")])
    _, err = capsys.readouterr()
    assert code == 2 and "no deployed pool named 'parity/deployed'" in err and "parity/fixed" in err, err


def test_from_name_of_a_pool_that_is_not_deployed_says_what_is(moto, capsys) -> None:
    code = run(["run", str(CORPUS / "from_name.py")])
    _, err = capsys.readouterr()
    assert code == 2 and "no deployed pool named 'parity/deployed' in this account and region" in err, err
