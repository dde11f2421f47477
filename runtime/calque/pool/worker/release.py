"""A graceful release that is not a delivery attempt: re-send the claim, then delete the held message.

SQS counts every receive towards the queue's ``maxReceiveCount``, so giving a message back with
visibility 0 (a SIGTERM, a spot notice, a rolling replacement) brought a healthy claim one step
nearer the DLQ: three restarts and it was dead-lettered without ever failing. Instead the stopping
worker sends the claim again as a new message whose ``attempts`` carries the receives of the old one
that did count (all but this one: a crash or a lost lease never reaches this code), and deletes
the old message. The worker's own poison check (``calque.pool.worker.claims``) reads ``Lease.attempt``,
the carried attempts plus this message's receive count, so real failures still add up across
re-sends; SQS's redrive still catches a claim that keeps crashing its worker.

A body that is not a ClaimRef cannot be re-sent (the next worker poisons it anyway): it gets the
old visibility-0 release. If the send fails, the claim falls back to visibility 0.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError

from calque.aws.queue import PoolQueue
from calque.errors import CalqueError
from calque.models import ClaimRef
from calque.pool.worker.lease import Lease

log = logging.getLogger("calque.pool.worker.loop")


def carried_ref(lease: Lease) -> ClaimRef | None:
    """The claim to re-send for ``lease``, its attempts raised by the counted receives; None when unparseable."""
    ref = lease.ref
    if ref is None:
        try:
            ref = ClaimRef.model_validate_json(lease.body)
        except ValidationError:
            return None
    counted = max(lease.receive_count, 1) - 1  # this receive ends gracefully: it does not count
    return ref.model_copy(update={"attempts": ref.attempts + counted})


def release_uncounted(queue: PoolQueue, lease: Lease, receipt: str) -> None:
    """Give ``lease``'s claim back without spending a delivery attempt (see the module docstring).

    Raises CalqueError only when even the visibility-0 fallback was refused (the claim then comes
    back after its visibility timeout, as before).
    """
    ref = carried_ref(lease)
    if ref is None:
        queue.release(receipt)
        return
    try:
        queue.send(ref)
    except CalqueError as exc:
        log.warning("could not re-send claim %s (%s): releasing it with visibility 0", ref.claim_id, exc)
        queue.release(receipt)
        return
    try:
        queue.ack(receipt)
    except CalqueError as exc:
        # the re-sent copy is out: this one comes back after the VT and its Summary makes it a duplicate
        log.warning("re-sent claim %s but could not delete message %s: %s", ref.claim_id, lease.message_id, exc)
