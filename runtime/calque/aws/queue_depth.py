"""A pool queue's depth read from SQS and CloudWatch, without pydantic (``calque pool status``'s start-up).

``PoolQueue`` (``calque.aws.queue``) makes its reads through these functions too and turns the
``DepthView`` into its model, ``QueueDepth``: one implementation of each read.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from calque.aws.aws_errors import aws_errors, is_not_found, translate
from calque.errors import InfrastructureError
from calque.models.pool_views import DepthView


def lookup_queue(sqs: Any, name: str) -> str | None:
    """The queue's URL; None when there is no such queue."""
    try:
        url: str = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        return url
    except (ClientError, BotoCoreError) as exc:
        if is_not_found(exc):
            return None
        raise translate(exc, f"look up SQS queue {name}") from exc


def queue_attributes(sqs: Any, url: str) -> dict[str, str]:
    with aws_errors(f"read the attributes of {url}"):
        attrs: dict[str, str] = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return attrs


def missing_queue(model: str, name: str) -> InfrastructureError:
    return InfrastructureError(
        f"no pool queue for model {model!r}: looked for SQS queue {name!r}. "
        "Create it with the calque.gpu.pool_queue module (playbooks/pool.yml)."
    )


def oldest_message_age(cloudwatch: Any, name: str) -> int | None:
    """The latest maximum of the queue's ``ApproximateAgeOfOldestMessage``; None when unknown."""
    # SQS publishes the age only as this CloudWatch metric (peeking would change receive counts)
    if cloudwatch is None:
        return None
    now = datetime.now(timezone.utc)
    try:
        points = cloudwatch.get_metric_statistics(
            Namespace="AWS/SQS",
            MetricName="ApproximateAgeOfOldestMessage",
            Dimensions=[{"Name": "QueueName", "Value": name}],
            StartTime=now - timedelta(minutes=15),
            EndTime=now + timedelta(minutes=1),
            Period=60,
            Statistics=["Maximum"],
        ).get("Datapoints", [])
    except (ClientError, BotoCoreError):
        return None
    if not points:
        return None
    latest = max(points, key=lambda p: p["Timestamp"])
    return int(latest["Maximum"])


def read_depth(sqs: Any, cloudwatch: Any, name: str, dlq: str, url: str) -> DepthView:
    """The queue's counts, the DLQ's visible messages and the oldest message's age.

    The DLQ is read beside the queue. The age is asked of CloudWatch only when the queue holds a
    message: an empty queue has no oldest message, whatever CloudWatch's last datapoint (minutes
    behind) still says, and its status then needs no CloudWatch client at all."""

    def dlq_visible() -> int:
        durl = lookup_queue(sqs, dlq)
        return int(queue_attributes(sqs, durl).get("ApproximateNumberOfMessages", 0)) if durl else 0

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="calque-depth") as pool:
        dlq_read = pool.submit(dlq_visible)
        attrs = queue_attributes(sqs, url)
        visible = int(attrs.get("ApproximateNumberOfMessages", 0))
        in_flight = int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0))
        delayed = int(attrs.get("ApproximateNumberOfMessagesDelayed", 0))
        oldest = oldest_message_age(cloudwatch, name) if visible + in_flight + delayed > 0 else None
        return DepthView(name, visible, in_flight, delayed, dlq_read.result(), oldest)
