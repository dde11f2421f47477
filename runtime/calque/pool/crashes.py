"""Claims that end their workers: marked while they run again, poisoned before they end a third.

Whatever a method does in Python fails its item or its claim (``calque.warm.supervisor``,
``Worker._run``), but a method can still end its process outright (``os._exit``, a segfault in C
code, the kernel's OOM killer), and SQS then hands the claim to the next worker, which it ends too.
So a redelivered claim (attempt 2 or later: its previous attempt ended without a Summary and without
a graceful release) is marked before it runs, at ``runs/<run>/running/<claim>/<attempt>.json``; the
mark is removed when this worker lets the claim go alive (released, lost). A worker that receives
attempt N >= 3 of a claim whose attempt N-1 is still marked knows that two workers in a row ended
while running it (N-1 died with the mark in place, and N-2 before it, or N-1 would not exist): it
poisons the claim with that reason, and the marks' own words when a dying worker could write any.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from calque.aws.store import RunStore
from calque.errors import CalqueError
from calque.models import ClaimRef
from calque.pool.lease import Lease

log = logging.getLogger("calque.pool.worker")
MARKED_FROM_ATTEMPT = 2  # a first delivery is not marked: no extra write on the ordinary path


def mark_uri(ref: ClaimRef, attempt: int) -> str:
    return f"{ref.results_prefix}running/{ref.claim_id}/{attempt:04d}.json"


@dataclass
class CrashMarks:
    store: RunStore
    worker_id: str

    def running(self, lease: Lease) -> None:
        """Before a redelivered claim runs: mark it (best effort; a failed write only weakens the guard)."""
        if lease.ref is None or lease.attempt < MARKED_FROM_ATTEMPT:
            return
        self._put(lease, "")

    def last_words(self, lease: Lease, reason: str) -> None:
        """The worker is dying with ``lease`` held: say why where the next attempt looks."""
        if lease.ref is not None:
            self._put(lease, reason)

    def cleared(self, lease: Lease) -> None:
        """This worker let the claim go alive (released, lost): it did not end a worker."""
        if lease.ref is None or lease.attempt < MARKED_FROM_ATTEMPT:
            return
        try:
            self.store.delete(mark_uri(lease.ref, lease.attempt))
        except CalqueError as exc:
            log.info("could not clear the running mark of claim %s: %s", lease.ref.claim_id, exc)

    def _put(self, lease: Lease, reason: str) -> None:
        assert lease.ref is not None
        body = {"worker_id": self.worker_id, "attempt": lease.attempt, "reason": reason}
        try:
            self.store.put(mark_uri(lease.ref, lease.attempt), json.dumps(body).encode())
        except CalqueError as exc:
            log.warning("could not mark claim %s as running: %s", lease.ref.claim_id, exc)


def verdict(store: RunStore, ref: ClaimRef, attempt: int) -> str | None:
    """Why attempt ``attempt`` of ``ref`` must not run (two workers ended running it), or None."""
    if attempt <= MARKED_FROM_ATTEMPT:
        return None
    try:
        data = store.get(mark_uri(ref, attempt - 1), 64 * 1024)
    except CalqueError:  # unreadable for now: run it (the queue's own redrive still bounds it)
        return None
    if data is None:
        return None
    try:
        mark = json.loads(data)
        said = f": {mark['reason']}" if mark.get("reason") else ""
        who = f" (last on worker {mark.get('worker_id', '?')}{said})"
    except (ValueError, TypeError, KeyError):
        who = ""
    return (
        f"this claim ended two workers in a row: attempts {attempt - 2} and {attempt - 1} stopped their worker "
        f"while running it{who}; it is not offered to a third. Run one of its items with calque run --local "
        "to see why"
    )
