"""The pool queue operation: options left out keep the queue's current values (the one merge), bounds first."""

from __future__ import annotations

import json

import pytest
from calque.aws.clients import client
from calque.aws.queue import PoolQueue, QueueState
from calque.errors import UsageError
from calque.models import QueueSettings
from calque.ops.pool_queue import PoolQueueOp, PoolQueueRequest, merge_settings

MODEL = "org/ops-queue"


def _state(exists: bool, **attributes: object) -> QueueState:
    return QueueState(model=MODEL, queue_name="q", dlq_name="q-dlq", exists=exists, attributes=attributes)


def test_merge_keeps_current_values_for_options_left_out() -> None:
    current = _state(True, **{**QueueSettings().model_dump(), "visibility_timeout": 77, "max_receive_count": 9})
    merged = merge_settings(current, {"max_receive_count": 3})
    assert merged.visibility_timeout == 77 and merged.max_receive_count == 3


def test_merge_gives_a_new_queue_the_defaults() -> None:
    assert merge_settings(_state(False), {"receive_wait": 5}) == QueueSettings(receive_wait=5)


def test_merge_names_the_bad_option_and_what_to_change() -> None:
    with pytest.raises(UsageError, match=r"visibility_timeout=43201: .*; change visibility_timeout"):
        merge_settings(_state(False), {"visibility_timeout": 43201})


def test_queue_operation_keeps_values_across_runs_and_checks_without_changing(moto: str) -> None:
    op = PoolQueueOp()
    first = op.run(PoolQueueRequest(model=MODEL, visibility_timeout=77))
    assert first.changed and first.result.attributes["visibility_timeout"] == 77
    again = op.run(PoolQueueRequest(model=MODEL))
    assert again.changed is False and again.result.attributes["visibility_timeout"] == 77
    check = op.run(PoolQueueRequest(model=MODEL, visibility_timeout=90), check_mode=True)
    assert check.changed and check.before["attributes"]["visibility_timeout"] == 77
    assert check.after["attributes"]["visibility_timeout"] == 90
    assert PoolQueue(client("sqs"), MODEL).state().attributes["visibility_timeout"] == 77
    gone = op.run(PoolQueueRequest(model=MODEL, state="absent"))
    assert gone.changed and gone.after == {"exists": False, "attributes": {}}


def test_an_empty_model_is_refused_before_aws() -> None:
    with pytest.raises(UsageError, match="model is empty"):
        PoolQueueOp().request({"model": " "})


def test_cli_pool_queue_renders_the_same_outcome_as_the_module(moto: str, capsys: pytest.CaptureFixture[str]) -> None:
    from calque.cli.main import run

    assert run(["pool", "queue", "--model", MODEL, "--visibility-timeout", "77", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["resource"] == "pool_queue" and first["changed"] is True
    assert first["result"]["attributes"]["visibility_timeout"] == 77
    assert run(["pool", "queue", "--model", MODEL, "--check", "--receive-wait", "3"]) == 0
    out = capsys.readouterr().out
    assert "plan (check mode, nothing changed):" in out and "would change" in out
    assert run(["pool", "queue", "--model", MODEL, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["changed"] is False and again["result"]["attributes"]["visibility_timeout"] == 77
    assert again["result"]["attributes"]["receive_wait"] == 20  # the check changed nothing
    assert run(["pool", "queue", "--model", MODEL, "--max-receive-count", "0"]) == 2
    assert "max_receive_count=0" in capsys.readouterr().err
