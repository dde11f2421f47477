"""The pool queue as an operation: one SQS queue per model and its dead-letter queue, present or absent.

Options left out keep an existing queue's current values (``merge_settings``, the one place that
rule lives); a new queue gets ``QueueSettings``' defaults. Bounds are checked before AWS is called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator

from calque.aws.queue import PoolQueue, QueueChange, QueueState
from calque.errors import RefusedError
from calque.models import QueueSettings
from calque.models.base import CalqueModel, PoolName
from calque.models.pool_names import ForeignPoolError
from calque.ops.base import Operation, validated
from calque.ops.outcome import Outcome

SETTINGS = tuple(QueueSettings.model_fields)


class PoolQueueRequest(CalqueModel):
    """The queue asked for; settings left None keep the queue's current values (defaults when new)."""

    model: str = Field(description="the model the pool serves (its identity when pool is not given)")
    pool: PoolName | None = Field(None, description="the pool's name; the queue is named and tagged from it")
    state: Literal["present", "absent"] = "present"
    visibility_timeout: int | None = None
    message_retention: int | None = None
    receive_wait: int | None = None
    max_receive_count: int | None = None
    dlq_retention: int | None = None
    encryption: bool | None = None

    @field_validator("model")
    @classmethod
    def _named(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("model is empty: give the pool's model name, e.g. model: meta-llama/Llama-3.1-8B-Instruct")
        return v

    def given(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SETTINGS if getattr(self, k) is not None}


class PoolQueueResult(CalqueModel):
    """The queue after the run (as it would be, in check mode)."""

    queue_name: str
    queue_url: str | None = None
    queue_arn: str | None = None
    dlq_url: str | None = None
    dlq_arn: str | None = None
    attributes: dict[str, Any] = Field(default_factory=dict)


def merge_settings(current: QueueState, given: dict[str, Any]) -> QueueSettings:
    """The settings to ensure: an existing queue's current values, overridden by the options given."""
    keep = {k: v for k, v in current.attributes.items() if v is not None} if current.exists else {}
    keep.update(given)
    return validated(QueueSettings, keep, "invalid pool queue settings")


@dataclass
class PoolQueuePlan:
    request: PoolQueueRequest
    queue: PoolQueue
    change: QueueChange  # computed in check mode: the predicted after
    settings: QueueSettings | None  # None for absent


class PoolQueueOp(Operation[PoolQueueRequest, PoolQueuePlan, PoolQueueResult]):
    name = "pool_queue"
    Request = PoolQueueRequest

    def plan(self, request: PoolQueueRequest) -> PoolQueuePlan:
        try:
            return self._plan(request)
        except ForeignPoolError as exc:  # another pool's queue: neither adopted nor deleted
            raise RefusedError(str(exc)) from None

    def _plan(self, request: PoolQueueRequest) -> PoolQueuePlan:
        validated(QueueSettings, request.given(), "invalid pool queue settings")  # before touching AWS
        queue = PoolQueue(self.aws.client("sqs"), request.model, pool=request.pool)
        if request.state == "absent":
            return PoolQueuePlan(request, queue, queue.remove(check_mode=True), None)
        settings = merge_settings(queue.state(), request.given())
        return PoolQueuePlan(request, queue, queue.ensure(settings, check_mode=True), settings)

    def check(self, plan: PoolQueuePlan) -> Outcome[PoolQueueResult]:
        return self._outcome(plan, plan.change, check_mode=True)

    def apply(self, plan: PoolQueuePlan) -> Outcome[PoolQueueResult]:
        if not plan.change.changed:
            return self._outcome(plan, plan.change, check_mode=False)
        change = plan.queue.remove() if plan.settings is None else plan.queue.ensure(plan.settings)
        return self._outcome(plan, change, check_mode=False)

    def _outcome(self, plan: PoolQueuePlan, change: QueueChange, *, check_mode: bool) -> Outcome[PoolQueueResult]:
        after = change.after
        verb = "delete" if plan.settings is None else ("create" if not change.before.exists else "update")
        return Outcome[PoolQueueResult](
            resource=self.name,
            check_mode=check_mode,
            changed=change.changed,
            before={"exists": change.before.exists, "attributes": change.before.attributes},
            after={"exists": after.exists, "attributes": after.attributes},
            actions=[f"{verb} SQS queue {after.queue_name} and {after.dlq_name}"] if change.changed else [],
            result=PoolQueueResult(
                queue_name=after.queue_name,
                queue_url=after.queue_url,
                queue_arn=after.queue_arn,
                dlq_url=after.dlq_url,
                dlq_arn=after.dlq_arn,
                attributes=after.attributes,
            ),
        )
