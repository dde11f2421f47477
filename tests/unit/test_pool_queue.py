"""PoolQueue against a real moto server: create-or-open, DLQ and redrive, depth, delete."""

from __future__ import annotations

import json

import pytest
from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.errors import InfrastructureError
from calque.models import QueueSettings


def test_ensure_creates_queue_and_dlq_with_redrive_then_is_idempotent(moto: str) -> None:
    sqs = client("sqs")
    q = PoolQueue(sqs, "org/model-a")
    first = q.ensure(QueueSettings(visibility_timeout=120, max_receive_count=3))
    assert first.changed and first.after.exists
    attrs = sqs.get_queue_attributes(QueueUrl=first.after.queue_url, AttributeNames=["All"])["Attributes"]
    redrive = json.loads(attrs["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == first.after.dlq_arn
    assert int(redrive["maxReceiveCount"]) == 3
    assert attrs["VisibilityTimeout"] == "120"
    assert attrs["SqsManagedSseEnabled"] == "true"
    again = q.ensure(QueueSettings(visibility_timeout=120, max_receive_count=3))
    assert not again.changed


def test_check_mode_plans_without_creating(moto: str) -> None:
    q = PoolQueue(client("sqs"), "m")
    plan = q.ensure(QueueSettings(), check_mode=True)
    assert plan.changed and plan.after.exists and not plan.before.exists
    assert not q.state().exists


def test_attribute_change_is_reported_before_and_after(moto: str) -> None:
    q = PoolQueue(client("sqs"), "m")
    q.ensure(QueueSettings(visibility_timeout=60))
    change = q.ensure(QueueSettings(visibility_timeout=90))
    assert change.changed
    assert change.before.attributes["visibility_timeout"] == 60
    assert change.after.attributes["visibility_timeout"] == 90


def test_depth_counts_visible_in_flight_and_dlq(moto: str) -> None:
    sqs = client("sqs")
    q = PoolQueue(sqs, "m")
    q.ensure(QueueSettings(max_receive_count=1, receive_wait=0))
    for i in range(3):
        sqs.send_message(QueueUrl=q.url(), MessageBody=str(i))
    q.receive(wait_s=0)
    d = q.depth()
    assert (d.visible, d.in_flight, d.dlq_visible) == (2, 1, 0)


def test_missing_queue_names_what_was_looked_for(moto: str) -> None:
    q = PoolQueue(client("sqs"), "nobody")
    with pytest.raises(InfrastructureError, match=q.name):
        q.depth()


def test_remove_deletes_both_and_is_idempotent(moto: str) -> None:
    q = PoolQueue(client("sqs"), "m")
    q.ensure(QueueSettings())
    assert q.remove().changed
    assert not q.state().exists and q.state().dlq_url is None
    assert not q.remove().changed
