"""``PoolQueue``: the one standard SQS queue per model, with its dead-letter queue.

Create-or-open is idempotent and computes a plan first (what would change), so the Ansible module's
check mode and diff are the same code path as the real apply. The worker-side calls (receive,
extend, delete) live here too so every SQS call of the pool goes through one place.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import Field

from calque.aws.aws_errors import aws_errors, describe, error_code, is_not_found, translate
from calque.aws.naming import dlq_name, pool_queue_name
from calque.aws.queue_depth import lookup_queue, missing_queue, queue_attributes, read_depth
from calque.errors import CalqueError, InfrastructureError
from calque.models import CalqueModel, ClaimRef, QueueDepth, QueueSettings
from calque.models.pool_names import POOL_TAG, pool_names, refuse_foreign

# SQS's SendMessageBatch takes at most ten entries.
SEND_BATCH = 10
_STALE_RECEIPT_CODES = frozenset({"InvalidParameterValue", "ReceiptHandleIsInvalid", "MessageNotInflight"})


class QueueState(CalqueModel):
    """What a pool queue is (or would be, in check mode)."""

    model: str
    queue_name: str
    dlq_name: str
    exists: bool
    queue_url: str | None = None
    queue_arn: str | None = None
    dlq_url: str | None = None
    dlq_arn: str | None = None
    attributes: dict[str, Any] = Field(default_factory=dict)


class QueueChange(CalqueModel):
    """The outcome of ``ensure``/``remove``: before, after and whether anything changed."""

    changed: bool
    before: QueueState
    after: QueueState


def _settings_from_attributes(main: dict[str, str], dlq: dict[str, str]) -> dict[str, Any]:
    redrive = json.loads(main.get("RedrivePolicy", "{}") or "{}")
    return {
        "visibility_timeout": int(main.get("VisibilityTimeout", 30)),
        "message_retention": int(main.get("MessageRetentionPeriod", 345600)),
        "receive_wait": int(main.get("ReceiveMessageWaitTimeSeconds", 0)),
        "max_receive_count": int(redrive.get("maxReceiveCount", 0)) or None,
        "dlq_retention": int(dlq.get("MessageRetentionPeriod", 345600)) if dlq else None,
        "encryption": str(main.get("SqsManagedSseEnabled", "false")).lower() == "true",
    }


class PoolQueue:
    """The queue of one model's pool. ``sqs`` is a boto3 SQS client (see ``calque.aws.clients``)."""

    def __init__(
        self, sqs: Any, model: str, queue_name: str | None = None, cloudwatch: Any = None, pool: str | None = None
    ) -> None:
        if not model:
            raise ValueError("model must be a non-empty string")
        self.sqs = sqs
        self.cloudwatch = cloudwatch
        self.model = model
        self.pool = pool  # a named pool's queue is named and tagged by the pool (calque.models.pool_names)
        self.name = queue_name or (pool_names(pool).queue if pool else pool_queue_name(model))
        self.dlq = dlq_name(self.name)
        self._url: str | None = None

    # -- reading -------------------------------------------------------------------------------

    def _lookup(self, name: str) -> str | None:
        return lookup_queue(self.sqs, name)

    def _attributes(self, url: str) -> dict[str, str]:
        return queue_attributes(self.sqs, url)

    def state(self) -> QueueState:
        """The queue as it is now (``exists=False`` when it does not)."""
        url = self._lookup(self.name)
        durl = self._lookup(self.dlq)
        main = self._attributes(url) if url else {}
        dlq = self._attributes(durl) if durl else {}
        return QueueState(
            model=self.model,
            queue_name=self.name,
            dlq_name=self.dlq,
            exists=url is not None,
            queue_url=url,
            queue_arn=main.get("QueueArn"),
            dlq_url=durl,
            dlq_arn=dlq.get("QueueArn"),
            attributes=_settings_from_attributes(main, dlq) if url else {},
        )

    def url(self) -> str:
        """The queue URL, or an error naming the queue that was looked for."""
        if self._url is None:
            self._url = self._lookup(self.name)
            if self._url is None:
                raise missing_queue(self.model, self.name)
        return self._url

    def depth(self) -> QueueDepth:
        """The queue's counts, the DLQ's visible messages and the oldest message's age (``read_depth``)."""
        view = read_depth(self.sqs, self.cloudwatch, self.name, self.dlq, self.url())
        return QueueDepth.model_validate(dataclasses.asdict(view))

    def backlog(self) -> tuple[int, int]:
        """(visible, in flight): the two counts the scaling policy's backlog sums, in one SQS call."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        url = self.url()
        with aws_errors(f"read the backlog of {url}"):
            attrs: dict[str, str] = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        return int(attrs.get(names[0], 0)), int(attrs.get(names[1], 0))

    # -- changing ------------------------------------------------------------------------------

    def desired(self, settings: QueueSettings) -> dict[str, Any]:
        return settings.model_dump()

    def _check_owner(self, before: QueueState) -> None:
        """Refuse a queue tagged for another pool (ForeignPoolError); nothing to check for a model-named queue."""
        if self.pool is None:
            return
        for url in (before.queue_url, before.dlq_url):
            if url is not None:
                with aws_errors(f"read the tags of {url}"):
                    tags = self.sqs.list_queue_tags(QueueUrl=url).get("Tags", {})
                refuse_foreign("SQS queue", url.rsplit("/", 1)[-1], tags, self.pool)

    def ensure(self, settings: QueueSettings, *, check_mode: bool = False) -> QueueChange:
        """Create the queue and DLQ, or bring their attributes to ``settings``. Idempotent."""
        before = self.state()
        self._check_owner(before)
        want = self.desired(settings)
        dlq_current = before.dlq_url is not None
        if before.exists and dlq_current and before.attributes == want:
            return QueueChange(changed=False, before=before, after=before)
        if check_mode:
            after = before.model_copy(update={"exists": True, "attributes": want})
            return QueueChange(changed=True, before=before, after=after)
        with aws_errors(f"create or update SQS queue {self.name}"):
            _, dlq_arn = self._ensure_dlq(settings, before.dlq_url)
            self._ensure_main(settings, before.queue_url, dlq_arn)
        self._url = None
        return QueueChange(changed=True, before=before, after=self.state())

    def _ensure_dlq(self, s: QueueSettings, url: str | None) -> tuple[str, str]:
        attrs = {
            "MessageRetentionPeriod": str(s.dlq_retention),
            "SqsManagedSseEnabled": str(s.encryption).lower(),
        }
        if url is None:
            url = self.sqs.create_queue(QueueName=self.dlq, Attributes=attrs, tags=self._tags())["QueueUrl"]
        else:
            self.sqs.set_queue_attributes(QueueUrl=url, Attributes=attrs)
        arn = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        return url, arn

    def _ensure_main(self, s: QueueSettings, url: str | None, dlq_arn: str) -> str:
        attrs = {
            "VisibilityTimeout": str(s.visibility_timeout),
            "MessageRetentionPeriod": str(s.message_retention),
            "ReceiveMessageWaitTimeSeconds": str(s.receive_wait),
            "SqsManagedSseEnabled": str(s.encryption).lower(),
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": s.max_receive_count}),
        }
        if url is None:
            created: str = self.sqs.create_queue(QueueName=self.name, Attributes=attrs, tags=self._tags())["QueueUrl"]
            return created
        self.sqs.set_queue_attributes(QueueUrl=url, Attributes=attrs)
        return url

    def _tags(self) -> dict[str, str]:
        tags = {"calque:model": self.model[:256], "calque:role": "pool-queue"}
        return {**tags, POOL_TAG: self.pool} if self.pool else tags

    def remove(self, *, check_mode: bool = False) -> QueueChange:
        """Delete the queue and its DLQ. Idempotent."""
        before = self.state()
        gone = before.model_copy(
            update={
                "exists": False,
                "queue_url": None,
                "queue_arn": None,
                "dlq_url": None,
                "dlq_arn": None,
                "attributes": {},
            }
        )
        if not before.exists and before.dlq_url is None:
            return QueueChange(changed=False, before=before, after=before)
        self._check_owner(before)
        if not check_mode:
            for url in (before.queue_url, before.dlq_url):
                if url is None:
                    continue
                try:
                    self.sqs.delete_queue(QueueUrl=url)
                except (ClientError, BotoCoreError) as exc:
                    if not is_not_found(exc):
                        raise translate(exc, f"delete SQS queue {url}") from exc
            self._url = None
        return QueueChange(changed=True, before=before, after=gone)

    # -- messages --------------------------------------------------------------------------------

    def send(self, ref: ClaimRef) -> str:
        url = self.url()
        with aws_errors(f"send a claim to {self.name}"):
            mid: str = self.sqs.send_message(QueueUrl=url, MessageBody=ref.body())["MessageId"]
        return mid

    def send_batch(self, refs: list[ClaimRef]) -> None:
        """Send up to ten claims in one SendMessageBatch; entries SQS refuses are retried once, then an error."""
        if len(refs) > SEND_BATCH:
            raise ValueError(f"SendMessageBatch takes at most {SEND_BATCH} messages, got {len(refs)}")
        entries = [{"Id": str(n), "MessageBody": ref.model_dump_json()} for n, ref in enumerate(refs)]
        url = self.url()
        for attempt in (1, 2):
            if not entries:
                return
            with aws_errors(f"send claims to {self.name}"):
                resp = self.sqs.send_message_batch(QueueUrl=url, Entries=entries)
            failed = {f["Id"]: f for f in resp.get("Failed", [])}
            entries = [e for e in entries if e["Id"] in failed]
            if entries and attempt == 2:
                first = next(iter(failed.values()))
                why = f"{first.get('Code')}: {first.get('Message')}"
                raise InfrastructureError(f"SQS refused {len(entries)} claim(s) sent to {self.name}: {why}")

    def receive(self, wait_s: int, max_messages: int = 1) -> list[dict[str, Any]]:
        """Long-poll for messages, asking for ``ApproximateReceiveCount``."""
        url = self.url()
        with aws_errors(f"receive from {self.name}"):
            resp = self.sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=max_messages,
                WaitTimeSeconds=wait_s,
                MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
            )
        messages: list[dict[str, Any]] = resp.get("Messages", [])
        return messages

    def receive_dead_letters(self, max_messages: int = 10) -> list[dict[str, Any]]:
        """Up to ``max_messages`` from the DLQ (hidden 60 s while they are recorded); [] when it has none."""
        durl = self._lookup(self.dlq)
        if durl is None:
            return []
        with aws_errors(f"receive from {self.dlq}"):
            resp = self.sqs.receive_message(
                QueueUrl=durl,
                MaxNumberOfMessages=max_messages,
                WaitTimeSeconds=0,
                VisibilityTimeout=60,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            )
        messages: list[dict[str, Any]] = resp.get("Messages", [])
        return messages

    def delete_dead_letter(self, receipt_handle: str) -> None:
        durl = self._lookup(self.dlq)
        if durl is None:
            return
        with aws_errors(f"delete a message from {self.dlq}"):
            self.sqs.delete_message(QueueUrl=durl, ReceiptHandle=receipt_handle)

    def extend(self, receipt_handle: str, seconds: int) -> None:
        """Change a held message's visibility (heartbeat, or 0 to release it at once)."""
        url = self.url()
        try:
            self.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=receipt_handle, VisibilityTimeout=seconds)
        except (ClientError, BotoCoreError) as exc:
            raise self._held_error(exc, "change visibility on") from exc

    def release(self, receipt_handle: str) -> None:
        """Give a held message back at once (visibility 0) so another worker takes it now."""
        self.extend(receipt_handle, 0)

    def visibility_timeout(self) -> int:
        """The queue's VisibilityTimeout in seconds (what a worker's heartbeat extends to)."""
        attrs = self._attributes(self.url())
        return int(attrs.get("VisibilityTimeout", 30))

    def max_receive_count(self) -> int | None:
        """The queue's redrive ``maxReceiveCount`` (receives before SQS dead-letters a message), None without one."""
        redrive = json.loads(self._attributes(self.url()).get("RedrivePolicy", "{}") or "{}")
        return int(redrive.get("maxReceiveCount", 0)) or None

    def ack(self, receipt_handle: str) -> None:
        url = self.url()
        try:
            self.sqs.delete_message(QueueUrl=url, ReceiptHandle=receipt_handle)
        except (ClientError, BotoCoreError) as exc:
            raise self._held_error(exc, "delete a message from") from exc

    def ack_many(self, receipts: list[str]) -> dict[str, CalqueError | None]:
        """DeleteMessageBatch for up to ten held messages: each receipt's error, None when deleted."""
        doing = "delete a message from"
        if len(receipts) > SEND_BATCH:
            raise ValueError(f"DeleteMessageBatch takes at most {SEND_BATCH} messages, got {len(receipts)}")
        entries = [{"Id": str(n), "ReceiptHandle": r} for n, r in enumerate(receipts)]
        try:
            resp = self.sqs.delete_message_batch(QueueUrl=self.url(), Entries=entries)
        except (ClientError, BotoCoreError) as exc:
            err = self._held_error(exc, doing)
            return dict.fromkeys(receipts, err)
        out: dict[str, CalqueError | None] = dict.fromkeys(receipts)
        for f in resp.get("Failed", []):
            receipt = receipts[int(f["Id"])]
            code, message = str(f.get("Code", "")), str(f.get("Message", ""))
            if code in _STALE_RECEIPT_CODES:
                out[receipt] = InfrastructureError(
                    f"cannot {doing} {self.name}: the message is no longer held by this worker ({code}: {message}); "
                    "its visibility ran out or another worker received it"
                )
            else:
                out[receipt] = InfrastructureError(f"cannot {doing} {self.name}: {code}: {message}")
        return out

    def _held_error(self, exc: ClientError | BotoCoreError, doing: str) -> CalqueError:
        # SQS answers a receipt handle that is no longer ours as an invalid parameter: that is a lost
        # lease (the visibility ran out, another worker received it), not a request to fix
        if error_code(exc) in _STALE_RECEIPT_CODES:
            return InfrastructureError(
                f"cannot {doing} {self.name}: the message is no longer held by this worker ({describe(exc)}); "
                "its visibility ran out or another worker received it"
            )
        return translate(exc, f"{doing} {self.name}")
