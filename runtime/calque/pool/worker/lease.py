"""One received claim message as an explicit state machine: named states, owned transitions, one lock.

::

    CLAIMED --runner--> WORKING --runner--> WRITING --writer--> SUMMARISED --writer--> DELETED
       |                   |                   |                    |
       |                   +--runner--> RELEASED (stopping mid-drain: given back)
       +--claimer--> POISONED --writer--> SUMMARISED (a failed Summary or a poison record)
       +--claimer--> DUPLICATE --writer--> DELETED (its Summary already exists)
       +--claimer--> ABANDONED (a read kept failing: left to come back after the VT)
    WRITING, POISONED, DUPLICATE, SUMMARISED --writer--> ABANDONED (a write or the delete failed: it comes back)
    CLAIMED, POISONED, DUPLICATE, WRITING --stopper--> RELEASED (shutdown gives unfinished claims back)
    any live state --keeper--> LOST (SQS refused to extend the receipt: another worker owns it now)

Each transition has one owner (a ``Role``: the thread kind that performs it); anything not in the
table raises ``IllegalTransition``. LOST and RELEASED are imposed on a lease by the keeper and the
stopper while its owner may still be busy with it, so owners advance with ``advance_unless_taken``,
which answers False once the lease was taken away. A transient read error is not LOST: the claimer
retries it within the lease (the heartbeat keeps extending it) and abandons it only after that.
"""

from __future__ import annotations

import contextlib
import enum
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TypeVar

from calque.errors import CalqueError
from calque.models import ClaimRef, Manifest

T = TypeVar("T")


class State(enum.Enum):
    CLAIMED = "claimed"  # received and held; being prepared (parse, checks, manifest)
    WORKING = "working"  # its items are draining
    WRITING = "writing"  # queued for, or in, a writer: results, then the Summary
    POISONED = "poisoned"  # cannot run: its failed Summary (or poison record) is to be written
    DUPLICATE = "duplicate"  # it already has a Summary: to be deleted without running
    SUMMARISED = "summarised"  # its Summary is in the store: the message is to be deleted
    DELETED = "deleted"  # done
    RELEASED = "released"  # given back (stopping): re-sent, or visibility 0
    ABANDONED = "abandoned"  # let go without a delete: SQS redelivers it after the VT
    LOST = "lost"  # SQS refused the receipt: never summarised or deleted by us


class Role(enum.Enum):
    CLAIMER = "claimer"  # the receiver thread (prefetch) or the main thread: receive and prepare
    RUNNER = "runner"  # the main thread: drain items
    WRITER = "writer"  # a writer thread: results, Summary, delete
    KEEPER = "keeper"  # whoever extends the receipt (the heartbeat, the writer's last check)
    STOPPER = "stopper"  # shutdown


S, R = State, Role
TRANSITIONS: dict[tuple[State, State], Role] = {
    (S.CLAIMED, S.WORKING): R.RUNNER,
    (S.CLAIMED, S.POISONED): R.CLAIMER,
    (S.CLAIMED, S.DUPLICATE): R.CLAIMER,
    (S.CLAIMED, S.ABANDONED): R.CLAIMER,
    (S.CLAIMED, S.RELEASED): R.STOPPER,
    (S.WORKING, S.WRITING): R.RUNNER,
    (S.WORKING, S.RELEASED): R.RUNNER,
    (S.WRITING, S.SUMMARISED): R.WRITER,
    (S.WRITING, S.ABANDONED): R.WRITER,
    (S.WRITING, S.RELEASED): R.STOPPER,
    (S.POISONED, S.SUMMARISED): R.WRITER,
    (S.POISONED, S.ABANDONED): R.WRITER,
    (S.POISONED, S.RELEASED): R.STOPPER,
    (S.DUPLICATE, S.DELETED): R.WRITER,
    (S.DUPLICATE, S.ABANDONED): R.WRITER,
    (S.DUPLICATE, S.RELEASED): R.STOPPER,
    (S.SUMMARISED, S.DELETED): R.WRITER,
    (S.SUMMARISED, S.ABANDONED): R.WRITER,
    **{(live, S.LOST): R.KEEPER for live in (S.CLAIMED, S.WORKING, S.WRITING, S.POISONED, S.DUPLICATE, S.SUMMARISED)},
}
FINAL = frozenset({S.DELETED, S.RELEASED, S.ABANDONED, S.LOST})
TAKEN = frozenset({S.LOST, S.RELEASED})  # imposed by another thread while the owner may be busy
LIVE = frozenset(State) - FINAL  # held: the heartbeat extends these


class IllegalTransition(RuntimeError):
    """A transition the table does not have, or one made by a role that does not own it (a bug)."""


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Prepared:
    """What the claimer learnt about a runnable claim (set once, before WORKING)."""

    ref: ClaimRef
    manifest: Manifest
    method: str


@dataclass(eq=False)
class Lease:
    """One received message: its receipt, its state, and what preparing it found."""

    message_id: str
    receipt: str
    body: str
    receive_count: int
    received_at: datetime = field(default_factory=_now)
    # part of this attempt's results key: unique even if two attempts shared receive count and worker id
    token: str = field(default_factory=lambda: secrets.token_hex(4))
    _state: State = State.CLAIMED
    _last_extended: float = field(default_factory=time.monotonic)
    ref: ClaimRef | None = None  # set by the claimer when the body parses (a poison Summary uses it too)
    prepared: Prepared | None = None
    problem: str | None = None  # why it is POISONED
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def state(self) -> State:
        with self._lock:
            return self._state

    @property
    def attempt(self) -> int:
        """This delivery's attempt number: the attempts the claim carries plus this message's receive count.

        Graceful releases re-send the claim (``calque.pool.worker.release``), so they never add to either.
        """
        carried = self.ref.attempts if self.ref is not None else 0
        return carried + max(self.receive_count, 1)

    @property
    def last_extended(self) -> float:
        with self._lock:
            return self._last_extended

    def _check(self, to: State, by: Role) -> None:
        owner = TRANSITIONS.get((self._state, to))
        if owner is None:
            raise IllegalTransition(f"lease {self.message_id}: no transition {self._state.name} -> {to.name}")
        if owner is not by:
            raise IllegalTransition(
                f"lease {self.message_id}: {self._state.name} -> {to.name} "
                f"belongs to the {owner.value}, not the {by.value}"
            )

    def advance(self, to: State, by: Role) -> None:
        """Make the transition to ``to`` as ``by``; raises ``IllegalTransition`` if it is not in the table."""
        with self._lock:
            self._check(to, by)
            self._state = to

    def advance_unless_taken(self, to: State, by: Role) -> bool:
        """Like ``advance``, but False (and no change) when the lease was already LOST or RELEASED."""
        with self._lock:
            if self._state in TAKEN:
                return False
            self._check(to, by)
            self._state = to
            return True

    def poison(self, problem: str) -> bool:
        """CLAIMED -> POISONED (claimer), recording why; False when the lease was taken meanwhile."""
        with self._lock:
            if self._state in TAKEN:
                return False
            self._check(State.POISONED, Role.CLAIMER)
            self.problem = problem
            self._state = State.POISONED
            return True

    def ready(self, prepared: Prepared) -> bool:
        """Record a runnable claim's preparation (claimer; it stays CLAIMED until the runner starts it).

        False when the lease was taken while it was being prepared (the runner then drops it).
        """
        with self._lock:
            if self._state in TAKEN:
                return False
            if self._state is not State.CLAIMED:
                raise IllegalTransition(f"lease {self.message_id}: prepared while {self._state.name}")
            self.prepared = prepared
            return True

    def extend(
        self, call: Callable[[str], object], on_refused: Callable[[CalqueError], None], *, require: State | None = None
    ) -> bool:
        """The keeper's extension: True when extended; LOST (and False) when SQS refuses the receipt.

        A lease already ended needs no extension (True, unless it is LOST); with ``require`` (the
        writer's last check before its Summary) anything but that state answers False.
        """
        with self._lock:
            if require is not None and self._state is not require:
                return False
            if self._state in FINAL:
                return self._state is not State.LOST
            try:
                call(self.receipt)
            except CalqueError as exc:
                self._check(State.LOST, Role.KEEPER)
                self._state = State.LOST
                on_refused(exc)
                return False
            self._last_extended = time.monotonic()
            return True

    def release(self, call: Callable[[str], object], by: Role) -> tuple[bool, CalqueError | None]:
        """Give the message back (``call``: re-send, or visibility 0) and end RELEASED.

        (False, None) when it had already ended.

        The error comes back when SQS refused the release (the lease ends RELEASED anyway: it comes back
        after the VT instead of at once). The receipt is used under the lock, so never after a delete.
        """
        with self._lock:
            if self._state in FINAL:
                return False, None
            self._check(State.RELEASED, by)
            self._state = State.RELEASED
            try:
                call(self.receipt)
            except CalqueError as exc:
                return True, exc
            return True, None

    def delete(self, call: Callable[[str], object]) -> bool:
        """The writer's delete: SUMMARISED or DUPLICATE -> DELETED; False when it was taken away first.

        If SQS refuses, the lease ends ABANDONED (it comes back; its Summary makes it a duplicate) and
        the error is raised.
        """
        with self._lock:
            if self._state in TAKEN:
                return False
            self._check(State.DELETED, Role.WRITER)
            try:
                call(self.receipt)
            except CalqueError:
                self._state = State.ABANDONED
                raise
            self._state = State.DELETED
            return True


def delete_together(
    leases: list[Lease], call: Callable[[list[str]], dict[str, CalqueError | None]]
) -> list[bool | CalqueError]:
    """The writer's delete of several leases in one call (``Lease.delete`` for each, one request).

    Per lease: True (DELETED), False (taken away first: not sent) or the error SQS gave its entry
    (ABANDONED: it comes back, and its Summary makes it a duplicate). Every lease's lock is held
    across the call, so no receipt is used after its delete (nothing else holds two at once).
    """
    with contextlib.ExitStack() as held:
        for lease in leases:
            held.enter_context(lease._lock)
        live = [lease for lease in leases if lease._state not in TAKEN]
        for lease in live:
            lease._check(State.DELETED, Role.WRITER)
        answers = call([lease.receipt for lease in live]) if live else {}
        out: list[bool | CalqueError] = []
        for lease in leases:
            if lease._state in TAKEN:
                out.append(False)
                continue
            err = answers.get(lease.receipt)
            lease._state = State.DELETED if err is None else State.ABANDONED
            out.append(True if err is None else err)
    return out
