"""``calque.gpu.pool_queue`` through real ansible-playbook runs against the moto server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from calque.aws.clients import client
from calque.aws.naming import pool_queue_name
from calque.aws.queue import PoolQueue
from support.ansible import BIN, COLLECTIONS, run_playbook

pytestmark = pytest.mark.slow

MODEL = "org/pool-queue-test"


def _task(name: str = "queue", **options: Any) -> dict[str, Any]:
    return {"name": name, "calque.gpu.pool_queue": {"model": MODEL, **options}}


def _sqs_attrs(name: str) -> dict[str, str]:
    sqs = client("sqs")
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    attrs: dict[str, str] = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return attrs


def test_create_then_second_run_is_unchanged(moto: str, tmp_path: Path) -> None:
    first = run_playbook(tmp_path, [_task(visibility_timeout=120, max_receive_count=3)])
    assert first.rc == 0, first.stdout + first.stderr
    r = first.task("queue")
    assert r["changed"] is True
    assert r["queue_name"] == pool_queue_name(MODEL)
    assert r["queue_url"].startswith(moto)
    assert r["queue_arn"].endswith(":" + pool_queue_name(MODEL))
    assert r["dlq_arn"].endswith(pool_queue_name(MODEL) + "-dlq")
    assert r["dlq_url"]
    assert r["attributes"]["visibility_timeout"] == 120
    assert r["attributes"]["max_receive_count"] == 3
    assert _sqs_attrs(pool_queue_name(MODEL))["VisibilityTimeout"] == "120"

    second = run_playbook(tmp_path, [_task(visibility_timeout=120, max_receive_count=3)])
    assert second.rc == 0, second.stdout + second.stderr
    assert second.task("queue")["changed"] is False
    assert second.task("queue")["queue_url"] == r["queue_url"]


def test_options_left_out_keep_the_queue_values(moto: str, tmp_path: Path) -> None:
    run_playbook(tmp_path, [_task(visibility_timeout=77)])
    again = run_playbook(tmp_path, [_task()])
    assert again.rc == 0, again.stdout + again.stderr
    assert again.task("queue")["changed"] is False
    assert again.task("queue")["attributes"]["visibility_timeout"] == 77


def test_attribute_change_shows_in_check_mode_diff_and_changes_nothing(moto: str, tmp_path: Path) -> None:
    run_playbook(tmp_path, [_task(visibility_timeout=60)])
    plan = run_playbook(tmp_path, [_task(visibility_timeout=90)], check=True, diff=True)
    assert plan.rc == 0, plan.stdout + plan.stderr
    r = plan.task("queue")
    assert r["changed"] is True
    assert r["diff"]["before"]["attributes"]["visibility_timeout"] == 60
    assert r["diff"]["after"]["attributes"]["visibility_timeout"] == 90
    assert _sqs_attrs(pool_queue_name(MODEL))["VisibilityTimeout"] == "60"

    real = run_playbook(tmp_path, [_task(visibility_timeout=90)], diff=True)
    assert real.task("queue")["diff"]["after"]["attributes"]["visibility_timeout"] == 90
    assert _sqs_attrs(pool_queue_name(MODEL))["VisibilityTimeout"] == "90"


def test_check_mode_create_creates_nothing(moto: str, tmp_path: Path) -> None:
    plan = run_playbook(tmp_path, [_task()], check=True, diff=True)
    assert plan.rc == 0, plan.stdout + plan.stderr
    r = plan.task("queue")
    assert r["changed"] is True
    assert r["diff"]["before"]["exists"] is False and r["diff"]["after"]["exists"] is True
    assert not PoolQueue(client("sqs"), MODEL).state().exists


def test_absent_deletes_both_queues_and_twice_is_unchanged(moto: str, tmp_path: Path) -> None:
    run_playbook(tmp_path, [_task()])
    plan = run_playbook(tmp_path, [_task(state="absent")], check=True)
    assert plan.task("queue")["changed"] is True
    assert PoolQueue(client("sqs"), MODEL).state().exists  # check mode deleted nothing
    gone = run_playbook(tmp_path, [_task(state="absent")])
    assert gone.rc == 0, gone.stdout + gone.stderr
    assert gone.task("queue")["changed"] is True
    state = PoolQueue(client("sqs"), MODEL).state()
    assert not state.exists and state.dlq_url is None
    again = run_playbook(tmp_path, [_task(state="absent")])
    assert again.rc == 0
    assert again.task("queue")["changed"] is False


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model": ""}, "model is empty"),
        ({"visibility_timeout": 43201}, "visibility_timeout=43201"),
        ({"max_receive_count": 0}, "max_receive_count=0"),
        ({"max_receive_count": 1001}, "max_receive_count=1001"),
        ({"receive_wait": 21}, "receive_wait=21"),
        ({"message_retention": 59}, "message_retention=59"),
    ],
)
def test_bad_input_fails_saying_what_to_change(
    moto: str, tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    run = run_playbook(tmp_path, [_task(**options)])
    assert run.rc != 0
    r = run.task("queue")
    assert r["failed"] is True
    assert message in r["msg"]
    if "=" in message:
        assert "change " + message.split("=")[0] in r["msg"]
    assert not PoolQueue(client("sqs"), MODEL).state().exists


def test_offline_refuses_a_non_loopback_endpoint(moto: str, tmp_path: Path) -> None:
    run = run_playbook(tmp_path, [_task(endpoint_url="https://sqs.us-east-1.amazonaws.com")])
    assert run.rc != 0
    assert "refuses the non-loopback endpoint" in run.task("queue")["msg"]


def test_module_defaults_group_calque_gpu_aws_sets_amazon_aws_options(
    moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ansible-core's group/aws reaches only amazon.aws and community.aws; calque.gpu.aws extends it.
    task = {
        "name": "group",
        "module_defaults": {"group/calque.gpu.aws": {"endpoint_url": moto, "region": "us-east-1"}},
        "block": [_task(), {"name": "caller", "amazon.aws.aws_caller_info": {}}],
    }
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    run = run_playbook(tmp_path, [task])
    assert run.rc == 0, run.stdout + run.stderr
    assert run.task("queue")["queue_url"].startswith(moto)
    assert run.task("caller")["account"]  # amazon.aws's module reached moto through the same defaults


def test_ansible_doc_renders() -> None:
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(
        [str(BIN / "ansible-doc"), "calque.gpu.pool_queue"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    for word in ("max_receive_count", "visibility_timeout", "endpoint_url", "queue_arn", "EXAMPLES"):
        assert word in proc.stdout
    assert "ERROR" not in proc.stderr
