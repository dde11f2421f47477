"""One grant: a checkout on one host's daemon for the request's user, between two commits.

The row is ``granting`` on the host (committed) before the call; the answer moves it to ``held``
(a session) or back to ``queued``: busy, or a refusal that another host or a later moment could
satisfy. A refusal is judged by listing the host again: with no matching slice offered there now
(drained, its MPS daemon down) it is a wait, like busy; with one offered, the host refuses this
request (a TTL over its maximum, the user's limits there, no such profile there) and the request is
not asked of that host again until its sessions change. It ends ``refused``, with every host's
words, once every host that offers such a slice has refused it. An unreachable host leaves the row
``granting`` there: the host may have made the session before the connection broke, so the request
is asked again of that host, and only of it, with the same request id, until it answers or
``granting_for`` passes.
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
from calque.session.broker.presence import Presence
from calque.session.broker.store import Row, Store

log = logging.getLogger("calque.broker")

# down: the host could not be connected to (nothing was sent: safe to try another host); gone: the
# request ended (cancelled, expired) while the host granted it: what it made is a stray (store.py)
Outcome = Literal["granted", "busy", "down", "unreachable", "refused", "gone"]


@dataclass
class Attempt:
    outcome: Outcome
    row: Row | None = None
    message: str = ""
    host: str = ""


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
    if row.gpu is not None:  # `checkout --gpu N` on its host: that GPU's slice, none other
        args["gpu"] = row.gpu
    if row.ttl is not None:
        args["ttl"] = row.ttl
    return args


class Granter:
    def __init__(
        self, store: Store, cache: HostCache, *, claim_window: float, presence: Presence | None = None
    ) -> None:
        self.store = store
        self.cache = cache
        self.claim_window = claim_window
        self.presence = presence or Presence()
        # request -> host -> the host's words and its cache version then: a host that refused the request
        # itself is asked for it again only once its sessions changed (a user's own session limit there)
        self._refusals: dict[str, dict[str, tuple[str, int]]] = {}
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
            return Attempt("refused", row, f"host {host} is not in the institution", host)
        try:
            raw = link.call("checkout", checkout_args(row, queued), request_id=row.id, as_user=row.user)
            session = Session.model_validate(raw)
        except NothingFreeError as exc:
            return Attempt("busy", row, str(exc), host)
        except (RefusedError, UsageError) as exc:
            if self._nothing_offered(host, row):
                return Attempt("busy", row, str(exc), host)  # drained, or its MPS daemon down: a later moment
            return Attempt("refused", row, str(exc), host)
        except UnreachableError as exc:  # never connected (RemoteHost, LocalHost's NotSent): nothing reached it
            self.cache.down(host, str(exc))
            return Attempt("down", row, str(exc), host)
        except (CalqueError, OSError, ValueError) as exc:
            log.warning("checkout of %s on %s did not answer: %s", row.id, host, exc)
            return Attempt("unreachable", row, str(exc), host)
        if session.ended_at is not None:  # a retried grant whose session was already given back
            done = self.store.finish(row.id, "claimed", "its session ended before the broker saw the grant")
            return Attempt("granted", done, host=host) if done is not None else self._gone(row, host)
        # The slice is busy in the cache before the grant is in the store: a reservation counts its
        # members' grants from the store, so the other order would, for a moment, show one slice both
        # used by a member and free (holding.py's ``spare``), and hand it to the queue.
        self.cache.taken(host, session.slice_id, session.id, session.expires_at)
        now = time.time()
        held = self.store.granted(
            row.id,
            session.model_dump(mode="json"),
            now=now,
            held_until=now + self.claim_window,
            ends_at=session.expires_at.timestamp(),
            claimed=answering,
        )
        if held is None:
            return self._gone(row, host)  # its session is a stray until checked in: busy, as marked
        log.info("granted %s to %s: session %s on %s", row.id, row.user, session.id, host)
        return Attempt("granted", held, host=host)

    def _gone(self, row: Row, host: str) -> Attempt:
        """The request ended while ``host`` granted it: its session is a stray, checked in by the loop."""
        self.store.stray(row.id, host)
        log.info("request %s ended while %s granted it; its session there is checked in", row.id, host)
        return Attempt("gone", self.store.get(row.id), "the request ended while its host granted it", host)

    def _nothing_offered(self, host: str, row: Row) -> bool:
        """The host refused and, listed again, offers no matching slice now (each busy, drained, or an
        MPS slot whose daemon is down): the request waits, for another host or a later moment, as it
        would for a busy one. With one offered, the refusal is of the request itself."""
        view, _ = self.cache.refresh(host)
        wanted = (row.kind, row.profile, row.gpu)
        return bool(matching(view, *wanted)) and not free_matching(view, *wanted)

    def refused_by(self, request_id: str) -> dict[str, str]:
        """The hosts that refused ``request_id`` itself, with their words."""
        with self._lock:
            return {host: why for host, (why, _) in self._refusals.get(request_id, {}).items()}

    def refuses_now(self, request_id: str, host: str) -> bool:
        """``host`` refused the request itself and nothing changed there since: not asked again yet."""
        with self._lock:
            seen = self._refusals.get(request_id, {}).get(host)
        return seen is not None and seen[1] == self.cache.version(host)

    def _refused_everywhere(self, row: Row) -> bool:
        """Every host known to offer such a slice has refused this request (none could ever grant it);
        for a request asked on one host (its ``only_host``), that host."""
        offering = {
            v.name
            for v in self.cache.views()
            if row.only_host in (None, v.name) and matching(v, row.kind, row.profile, row.gpu)
        }
        return offering <= set(self.refused_by(row.id))

    def refusals_text(self, request_id: str) -> str:
        return "; ".join(f"{h}: {why}" for h, why in sorted(self.refused_by(request_id).items()))

    def settle(self, attempt: Attempt, row: Row) -> Row | None:
        """What a failed attempt leaves: busy (or a host that is down, or a refusal another host could
        satisfy) puts a waiting request back in its place (a direct try is answered busy); a refusal
        no host could satisfy ends it with every host's words; unreachable leaves it ``granting``."""
        if self.record(attempt, row):
            why = self.refusals_text(row.id)
            self.forget(row.id)
            return self.store.finish(row.id, "refused", f"refused by every host that offers it: {why}")
        if attempt.outcome in ("busy", "down", "refused"):
            if row.wait:
                return self.store.requeue(row.id, attempt.message)
            refused = self.refusals_text(row.id)
            self.forget(row.id)
            return self.store.finish(row.id, "refused", "busy" + (f"; refused by {refused}" if refused else ""))
        return self.store.get(row.id)

    def record(self, attempt: Attempt, row: Row) -> bool:
        """Remember a host's refusal of the request itself; whether every host offering such a slice
        has now refused it (then nothing could ever grant it)."""
        if attempt.outcome != "refused":
            return False
        with self._lock:
            self._refusals.setdefault(row.id, {})[attempt.host] = (attempt.message, self.cache.version(attempt.host))
        return self._refused_everywhere(row)

    def forget_except(self, live: set[str]) -> None:
        """Forget the refusals of requests no longer live."""
        with self._lock:
            for rid in [r for r in self._refusals if r not in live]:
                del self._refusals[rid]

    def forget(self, request_id: str) -> None:
        """What is known of a request that ended (its refusals)."""
        with self._lock:
            self._refusals.pop(request_id, None)

    def watch(self, request_id: str) -> threading.Event:
        """The event a waiting client's thread waits on (``unwatch`` when it is done): the request has
        a client while one is watched."""
        self.presence.attach(request_id)
        with self._lock:
            return self._events.setdefault(request_id, threading.Event())

    def unwatch(self, request_id: str) -> None:
        self.presence.detach(request_id)
        with self._lock:
            if self.presence.present(request_id):
                return  # another connection of the same request still waits on it
            self._events.pop(request_id, None)

    def notify(self, request_id: str) -> None:
        with self._lock:
            ev = self._events.get(request_id)
        if ev is not None:
            ev.set()
