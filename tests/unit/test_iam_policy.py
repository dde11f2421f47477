"""A pool's IAM documents: scoped to the pool's own resources, matching the store's keys, documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from calque.aws.iam_policy import PoolIamDocuments, pool_arns, pool_iam_documents
from calque.aws.store import RunStore
from calque.cli.main import cli, run
from calque.errors import UsageError
from calque.models.pool_names import pool_names
from calque.pool.bootstrap import workload_key
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
WHERE = {"bucket": "lab-calque-runs", "region": "us-east-1", "account": "123456789012"}


def _statements(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["Sid"]: s for s in doc["Statement"]}


def _resources(statement: dict[str, Any]) -> list[str]:
    r = statement["Resource"]
    return r if isinstance(r, list) else [r]


def test_worker_policy_names_only_the_pools_own_queue_keys_and_group() -> None:
    docs = pool_iam_documents("lab-a/embedder", **WHERE)
    names = pool_names("lab-a/embedder")
    s = _statements(docs.worker_policy)
    assert set(s) == {"PoolQueue", "PoolObjects", "PoolKeysOnly", "PoolGroupOnly", "FindOwnGroup"}
    assert _resources(s["PoolQueue"]) == [f"arn:aws:sqs:us-east-1:123456789012:{names.queue}"]
    assert "sqs:SendMessage" in s["PoolQueue"]["Action"] and "sqs:DeleteQueue" not in s["PoolQueue"]["Action"]
    assert _resources(s["PoolObjects"]) == [f"arn:aws:s3:::lab-calque-runs/calque/pools/{names.queue}/*"]
    assert s["PoolKeysOnly"]["Condition"] == {"StringLike": {"s3:prefix": [f"calque/pools/{names.queue}/*"]}}
    assert _resources(s["PoolGroupOnly"])[0].endswith(f":autoScalingGroupName/{names.group}")
    assert s["PoolGroupOnly"]["Condition"] == {
        "StringEquals": {"autoscaling:ResourceTag/calque:pool": "lab-a/embedder"}
    }
    unscoped = [st for st in s.values() if "*" in _resources(st)]
    assert unscoped == [s["FindOwnGroup"]] and sorted(s["FindOwnGroup"]["Action"]) == [
        "autoscaling:DescribeAutoScalingGroups",  # its budget hold (issue 34)
        "autoscaling:DescribeAutoScalingInstances",
    ]
    assert docs.trust_policy["Statement"] == [
        {
            "Sid": "PoolInstances",
            "Effect": "Allow",
            "Principal": {"Service": "ec2.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ]
    assert (docs.role_name, docs.instance_profile_name, docs.policy_name) == (names.role,) * 3
    assert docs.tags == {"calque:pool": "lab-a/embedder"}


def test_two_labs_serving_one_model_share_no_resource_in_their_policies() -> None:
    a = json.dumps(pool_iam_documents("lab-a/embedder", **WHERE).worker_policy)
    b_docs = pool_iam_documents("lab-b/embedder", **WHERE)
    for st in b_docs.worker_policy["Statement"]:
        for r in _resources(st):
            if r not in (f"arn:aws:s3:::{WHERE['bucket']}", "*"):  # the shared bucket (listed under b's keys only)
                assert r not in a


def test_every_key_a_worker_touches_lies_under_the_policys_prefix() -> None:
    arns = pool_arns("lab-a/embedder", prefix="calque/v2", **WHERE)
    granted = arns.objects.removeprefix(f"arn:aws:s3:::{WHERE['bucket']}/").removesuffix("*")
    store = RunStore(None, WHERE["bucket"], "calque/v2", pool_names("lab-a/embedder").queue)
    run = store.run_prefix("run-1")
    keys = [
        run + "run.json",
        RunStore.manifest_uri(run, "c00000"),
        RunStore.results_uri(run, "c00000", RunStore.attempt_results_key("c00000", 1, "host:1", "ab12cd34")),
        RunStore.summary_uri(run, "c00000"),
        store.poison_uri("m-1"),
        f"s3://{WHERE['bucket']}/" + workload_key("calque/v2", store.base.rsplit("/", 1)[1], Path("embed.py")),
    ]
    for uri in keys:
        assert uri.removeprefix(f"s3://{WHERE['bucket']}/").startswith(granted), uri


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"account": "12345"}, "12 digits"),
        ({"region": "Virginia"}, "region name"),
        ({"bucket": "Lab_Bucket"}, "bucket name"),
        ({"prefix": "../other"}, "segment"),
    ],
)
def test_a_malformed_input_is_refused_naming_it(change: dict[str, str], says: str) -> None:
    args: dict[str, str] = {**WHERE, "prefix": "calque", **change}
    with pytest.raises(UsageError, match=says):
        pool_arns("lab-a/embedder", **args)


def test_controller_may_pass_the_pools_role_alone_and_fits_a_managed_policy() -> None:
    docs = pool_iam_documents("lab-a/embedder", **WHERE)
    s = _statements(docs.controller_policy)
    passing = [st for st in s.values() if "iam:PassRole" in st["Action"]]
    assert passing == [s["PassWorkerRoleOnly"]] and _resources(passing[0]) == [docs.role_arn]
    assert s["CreatePoolGroup"]["Condition"] == {"StringEquals": {"aws:RequestTag/calque:pool": "lab-a/embedder"}}
    unscoped = {sid for sid, st in s.items() if "*" in _resources(st)}
    assert unscoped == {"ReadOnlyUnscoped", "LaunchFromTemplateOnly"}
    assert all(a.split(":")[1].startswith(("Describe", "Get")) for a in s["ReadOnlyUnscoped"]["Action"])
    assert len(json.dumps(docs.controller_policy, separators=(",", ":"))) < 6144


def test_cli_prints_the_documents_and_refuses_without_a_region(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "pool",
        "iam-policy",
        "--pool",
        "lab-a/embedder",
        "--bucket",
        WHERE["bucket"],
        "--account",
        WHERE["account"],
    ]
    res = CliRunner().invoke(cli, [*args, "--region", "us-east-1"], env={"AWS_REGION": None})
    assert res.exit_code == 0, res.output
    assert PoolIamDocuments.model_validate_json(res.output) == pool_iam_documents("lab-a/embedder", **WHERE)
    res = CliRunner().invoke(cli, [*args, "--region", "us-east-1", "--document", "worker"])
    assert json.loads(res.output) == pool_iam_documents("lab-a/embedder", **WHERE).worker_policy
    monkeypatch.delenv("AWS_REGION", raising=False)
    assert run(args) == UsageError.exit_code
    assert "--region" in capsys.readouterr().err


def test_pool_doc_policy_blocks_are_current() -> None:
    env = {**os.environ, "CALQUE_VENV_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(REPO / "scripts" / "gen-pool-iam-docs"), "--check"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr + " (run scripts/gen-pool-iam-docs and commit docs/pool.md)"
