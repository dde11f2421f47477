"""A strict in-process SQS: what moto is lenient about, real SQS is not.

Each receive gives a message a new receipt handle. A stale handle (an earlier receive's, or one
whose visibility already ran out) cannot change visibility (an error, as on SQS) and its delete
"succeeds" without deleting anything (as SQS documents for an outdated handle).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError


@dataclass
class _Msg:
    id: str
    body: str
    visible_at: float = 0.0
    receive_count: int = 0
    handle: str | None = None


class StrictFakeSqs:
    URL = "https://sqs.us-east-1.amazonaws.com/000000000000/strict"

    def __init__(self, visibility_timeout: int = 30) -> None:
        self.vt = visibility_timeout
        self.messages: dict[str, _Msg] = {}
        self.delete_calls: list[tuple[str, bool]] = []  # (handle, actually deleted)
        self.lock = threading.Lock()
        # test control: when set, only the thread of this name receives (others long-poll empty)
        self.deliver_to: str | None = None

    @staticmethod
    def _error(code: str, message: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": message}}, "Strict")

    def get_queue_url(self, QueueName: str) -> dict[str, str]:
        return {"QueueUrl": self.URL}

    def get_queue_attributes(self, QueueUrl: str, AttributeNames: list[str]) -> dict[str, Any]:
        return {"Attributes": {"VisibilityTimeout": str(self.vt)}}

    def send_message(self, QueueUrl: str, MessageBody: str) -> dict[str, str]:
        mid = str(uuid.uuid4())
        with self.lock:
            self.messages[mid] = _Msg(mid, MessageBody)
        return {"MessageId": mid}

    def receive_message(self, QueueUrl: str, MaxNumberOfMessages: int = 1, WaitTimeSeconds: int = 0, **_: Any):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + WaitTimeSeconds
        while True:
            now = time.monotonic()
            mine = self.deliver_to is None or threading.current_thread().name == self.deliver_to
            with self.lock:
                for m in self.messages.values() if mine else ():
                    if m.visible_at <= now:
                        m.handle = f"{m.id}#{uuid.uuid4().hex[:8]}"
                        m.visible_at = now + self.vt
                        m.receive_count += 1
                        attrs = {"ApproximateReceiveCount": str(m.receive_count)}
                        return {"Messages": [{"MessageId": m.id, "ReceiptHandle": m.handle, "Body": m.body,
                                              "Attributes": attrs}]}  # fmt: skip
            if now >= deadline:
                return {}
            time.sleep(0.01)

    def _current(self, handle: str) -> _Msg | None:
        m = self.messages.get(handle.split("#", 1)[0])
        if m is None or m.handle != handle or m.visible_at <= time.monotonic():
            return None
        return m

    def change_message_visibility(self, QueueUrl: str, ReceiptHandle: str, VisibilityTimeout: int) -> dict:  # type: ignore[type-arg]
        with self.lock:
            m = self._current(ReceiptHandle)
            if m is None:
                raise self._error(
                    "InvalidParameterValue", "Message does not exist or is not available for visibility timeout change"
                )
            m.visible_at = time.monotonic() + VisibilityTimeout
        return {}

    def delete_message(self, QueueUrl: str, ReceiptHandle: str) -> dict:  # type: ignore[type-arg]
        with self.lock:
            m = self._current(ReceiptHandle)
            if m is not None:
                del self.messages[m.id]
            self.delete_calls.append((ReceiptHandle, m is not None))
        return {}

    # test controls
    def expire(self, message_id: str) -> None:
        """Make a held message visible now, as if its holder had missed its heartbeats."""
        with self.lock:
            self.messages[message_id].visible_at = 0.0

    def in_flight(self) -> list[_Msg]:
        now = time.monotonic()
        with self.lock:
            return [m for m in self.messages.values() if m.receive_count and m.visible_at > now]
