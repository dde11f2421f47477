"""One grant: a checkout on one host's daemon for the request's user, between two commits.

The row is ``granting`` on the host (committed) before the call; the answer moves it to ``held``
(a session), back to ``queued`` (busy: that host holds nothing for it) or to ``refused`` (the host
refuses this user such a slice: a limit, a TTL over the host's maximum). An unreachable host leaves
the row ``granting`` there: the host may have made the session before the connection broke, so the
request is asked again of that host, and only of it, with the same request id, until it answers.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

from calque.errors import CalqueError, NothingFreeError, RefusedError, UnreachableError, UsageError
from calque.models.session import Session
from calque.session.broker.hosts import HostCache, free_matching, matching
from calque.session.broker.store import Row, Store

log = logging.getLogger("calque.broker")

# down: the host could not be connected to (nothing was sent: safe to try another host)
Outcome = Literal["granted", "busy", "down", "unreachable", "refused"]


@dataclass
class Attempt:
    outcome: Outcome
    row: Row | None = None
    message: str = ""


def checkout_args(row: Row, queued: bool = False) -> dict[str, Any]:
    """The host checkout a request asks for, with its request id (the host's idempotency key); for a
    request granted from the queue, when it joined it (the host records the wait as demand)."""
    args: dict[str, Any] = {"mps": row.kind == "mps", "consent": row.consent, "request_id": row.id}
    if row.lab != "default":  # the lab it queued for is the lab the host bills (fairness.chosen_lab)
        args["lab"] = row.lab
    if queued:
        args["queued_since"] = float(row.enqueued_at)
    if row.profile is not None:
        args["profile"] = row.profile
    if row.ttl is not None:
        args["ttl"] = row.ttl
    return args


class Granter:
    def __init__(self, store: Store, cache: HostCache, *, claim_window: float) -> None:
        self.store = store
        self.cache = cache
        self.claim_window = claim_window
        self._active: set[str] = set()  # requests a thread is granting now (the rest may be recovered)
        self._lock = threading.Lock()
        # One event per request a client waits on, set after every change of that request's state: a
        # grant wakes its own waiter, not the other 199.
        self._events: dict[str, threading.Event] = {}

    def busy_with(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._active

    def _claim_slot(self, request_id: str) -> bool:
        with self._lock:
            if request_id in self._active:
                return False
            self._active.add(request_id)
            return True

    def _release_slot(self, request_id: str) -> None:
        with self._lock:
            self._active.discard(request_id)
        self.notify(request_id)

    def attempt(self, row: Row, host: str, *, answering: bool = False, queued: bool = False) -> Attempt:
        """Ask ``host`` for ``row``'s slice; ``row`` is already ``granting`` on ``host``. ``answering``:
        the caller answers the request's client itself (the grant is claimed in the same commit)."""
        if not self._claim_slot(row.id):
            return Attempt("unreachable", row, "another thread is granting this request")
        try:
            return self._attempt(row, host, answering, queued)
        finally:
            self._release_slot(row.id)

    def _attempt(self, row: Row, host: str, answering: bool, queued: bool) -> Attempt:
        link = self.cache.links.get(host)
        if link is None:
            return Attempt("refused", self.store.finish(row.id, "refused", f"host {host} is not in the institution"))
        try:
            raw = link.call("checkout", checkout_args(row, queued), request_id=row.id, as_user=row.user)
            session = Session.model_validate(raw)
        except NothingFreeError as exc:
            return Attempt("busy", row, str(exc))
        except (RefusedError, UsageError) as exc:
            if self._drained_since(host, row):
                return Attempt("busy", row, str(exc))  # drained after the broker's last look: wait elsewhere
            return Attempt("refused", row, str(exc))
        except UnreachableError as exc:  # never connected (RemoteHost, LocalHost's NotSent): nothing reached it
            self.cache.down(host, str(exc))
            return Attempt("down", row, str(exc))
        except (CalqueError, OSError, ValueError) as exc:
            log.warning("checkout of %s on %s did not answer: %s", row.id, host, exc)
            return Attempt("unreachable", row, str(exc))
        if session.ended_at is not None:  # a retried grant whose session was already given back
            done = self.store.finish(row.id, "claimed", "its session ended before the broker saw the grant")
            return Attempt("granted", done)
        now = time.time()
        held = self.store.granted(
            row.id,
            session.model_dump(mode="json"),
            now=now,
            held_until=now + self.claim_window,
            ends_at=session.expires_at.timestamp(),
            claimed=answering,
        )
        self.cache.taken(host, session.slice_id, session.id, session.expires_at)
        log.info("granted %s to %s: session %s on %s", row.id, row.user, session.id, host)
        return Attempt("granted", held)

    def _drained_since(self, host: str, row: Row) -> bool:
        """The host refused because every matching slice there is drained now (listed again to see):
        the request waits for another host, or for the undrain, as it would for a busy one."""
        view, _ = self.cache.refresh(host)
        mine = matching(view, row.kind, row.profile)
        return (
            bool(mine) and not free_matching(view, row.kind, row.profile) and all(s.drained for s in mine if not s.busy)
        )

    def settle(self, attempt: Attempt, row: Row) -> Row | None:
        """What a failed attempt leaves: busy (or a host that is down) puts a waiting request back in
        its place (a direct try is refused), refused ends it with the host's words; unreachable
        leaves it ``granting``."""
        if attempt.outcome in ("busy", "down"):
            if row.wait:
                return self.store.requeue(row.id, attempt.message)
            return self.store.finish(row.id, "refused", attempt.message)
        if attempt.outcome == "refused":
            return self.store.finish(row.id, "refused", attempt.message)
        return self.store.get(row.id)

    def watch(self, request_id: str) -> threading.Event:
        """The event a waiting client's thread waits on (``unwatch`` when it is done)."""
        with self._lock:
            return self._events.setdefault(request_id, threading.Event())

    def unwatch(self, request_id: str) -> None:
        with self._lock:
            self._events.pop(request_id, None)

    def notify(self, request_id: str) -> None:
        with self._lock:
            ev = self._events.get(request_id)
        if ev is not None:
            ev.set()
