"""The broker's one loop: list hosts (nudged ones at once, every host every ``poll_every``), finish
grants a crash left half done, expire those whose host stayed silent past ``granting_for``, check in
what a host made for a request that ended meanwhile (a stray), pass on grants nobody claimed, drop
queued requests whose client has been gone past the claim window, and give free slices to the queue
in its fair order (never to a request on a host that refused it, until that host's sessions change).

It runs in one thread and never calls a host itself: each list, grant and give-back runs on a thread
of its own (``hostcalls.py``), at most one list and one change in flight per host, so a host that
hangs holds neither the loop nor a grant elsewhere, and two grants never race for one host's slices
in the broker (the hosts refuse a double assignment anyway: a slice's one live session is a unique
index of their registry). A call that ends wakes the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial

from calque.errors import CalqueError, NothingFreeError, RefusedError, UsageError
from calque.models.session import Session
from calque.session.broker.broker_config import BrokerConfig
from calque.session.broker.fairness import Waiting, lab_usage, order
from calque.session.broker.fairusage import Recorded
from calque.session.broker.grants import Granter, checkout_args
from calque.session.broker.holding import MIN_TTL_S, Holding
from calque.session.broker.hostcalls import HostCalls
from calque.session.broker.hosts import HostCache, call_id, free_matching, offered
from calque.session.broker.store import Row, Store

log = logging.getLogger("calque.broker")

PRUNE_EVERY_S = 3600.0
GrantHook = Callable[[Row], None]
TickHook = Callable[[Store, HostCache, float], None]
AuditHook = Callable[..., None]  # BrokerAudit.event: (event, **fields)


class Dispatcher:
    def __init__(
        self,
        config: BrokerConfig,
        store: Store,
        cache: HostCache,
        granter: Granter,
        shares: Mapping[str, float],
        on_grant: GrantHook = lambda row: None,
        on_tick: TickHook = lambda store, cache, now: None,
    ) -> None:
        self.config = config
        self.store = store
        self.cache = cache
        self.granter = granter
        self.shares = dict(shares)
        self.on_grant = on_grant
        self.on_tick = on_tick
        self.audit: AuditHook = lambda event, **fields: None  # the process's BrokerAudit, when it has one
        self.wake = threading.Event()
        self._nudged: set[str] = set()
        # (request, host) -> the host's cache version when it answered busy: not asked again until it changes
        self._busy_at: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self.calls = HostCalls(config.host_answer_within, on_done=self.wake.set)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-dispatch", daemon=True)
        self._pruned_at = 0.0  # monotonic
        # Every host's own record of its sessions (fairusage.py; the process sets it): without one, a
        # lab's usage is the broker's grants alone.
        self.recorded: Callable[[], Recorded] = dict
        self.holding: Holding | None = None  # reservations under way and ahead (the process sets it)

    def start(self) -> None:
        self.store.extend_holds(time.time() + self.config.queue.claim_window)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self.wake.set()
        self._thread.join(timeout=10)

    def nudge(self, host: str | None = None) -> None:
        """A host changed (list it now), or the queue did (``None``): the loop looks again at once."""
        if host is not None:
            with self._lock:
                self._nudged.add(host)
        self.wake.set()

    def ordered(self, now: float, rows: list[Row] | None = None) -> list[Waiting]:
        """The queued requests in the order grants follow (``calque session queue`` shows this).

        ``rows``: requests already read from the store (queued ones are picked out), so that a caller
        showing rows and their positions shows one reading of the queue, not two a submit fell between."""
        q = self.config.queue
        queued = self.store.in_state("queued") if rows is None else [r for r in rows if r.state == "queued"]
        waiting = [r.waiting for r in queued if r.reservation is None]
        usage = lab_usage(self.store.grants(now - q.fair_share_window, now), self.recorded())
        # Members waiting under a reservation under way come first, in arrival order (holding.py).
        return [r.waiting for r in queued if r.reservation is not None] + order(
            waiting,
            usage,
            self.shares,
            now=now,
            aging=q.aging,
            assumed_ttl=q.assumed_ttl,
            default_share=q.default_share,
        )

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.step()
            except Exception:
                log.exception("the broker's loop failed a step; it goes on")
            self.wake.wait(timeout=min(self.config.poll_every, 0.5))
            self.wake.clear()

    def step(self) -> None:
        with self._lock:
            nudged, self._nudged = self._nudged, set()
        for name in sorted(nudged | set(self.cache.due(self.config.poll_every))):
            if name not in self.cache.links:
                continue
            started = self.calls.run(name, "list", partial(self._list, name))
            if not started and name in nudged:  # a list already in flight may have read the host before the change
                with self._lock:
                    self._nudged.add(name)
        for name, for_s in self.calls.silent().items():
            self.cache.down(name, f"has not answered for {for_s:.1f} s")
        live = {r.id for r in self.store.live()}
        self.granter.forget_except(live)
        self.granter.presence.forget(live)
        self._recover()
        self._expire(time.time())
        self._drop()
        self._strays()
        self._match(time.time())
        self.on_tick(self.store, self.cache, time.time())
        if time.monotonic() - self._pruned_at > PRUNE_EVERY_S:
            self._pruned_at = time.monotonic()
            self.store.prune(time.time() - self.config.queue.fair_share_window)

    def _list(self, name: str) -> None:
        _, ended = self.cache.refresh(name)
        now = time.time()
        for sid in ended:
            self.store.session_ended(name, sid, now)

    def _recover(self) -> None:
        """Grants a crash (or an unreachable host) left ``granting``: asked again of that host."""
        for row in self.store.in_state("granting"):
            if row.host is None or self.granter.busy_with(row.id) or not self.cache.view(row.host).reachable:
                continue
            self.calls.run(row.host, "change", partial(self._recover_one, row))

    def _recover_one(self, row: Row) -> None:
        assert row.host is not None
        attempt = self.granter.attempt(row, row.host)
        if attempt.outcome == "granted":
            if attempt.row is not None:
                self.on_grant(attempt.row)
        elif attempt.outcome not in ("unreachable", "down"):  # down: still may hold what it made
            self.granter.settle(attempt, row)
        self.granter.notify(row.id)

    def _expire(self, now: float) -> None:
        for row in self.store.in_state("queued"):
            if row.wait_until is not None and row.wait_until <= now:
                self.store.finish(row.id, "timedout", "waited past --wait-timeout", only=("queued",))
                self.granter.notify(row.id)
        for row in self.store.in_state("held"):
            if row.held_until is not None and row.held_until <= now and row.host is not None:
                self.calls.run(row.host, "change", partial(self._lapse, row))
        bound = self.config.queue.granting_for
        for row in self.store.in_state("granting"):
            since = row.granting_at if row.granting_at is not None else row.enqueued_at
            if now - since < bound or self.granter.busy_with(row.id):
                continue
            why = (
                f"host {row.host} did not answer its checkout for {bound:g} s; whatever it made for this "
                "request is checked in when it answers again"
            )
            if self.store.expire_grant(row.id, why) is not None:
                log.warning("request %s of %s expired: %s", row.id, row.user, why)
                self.audit("request_expired", request=row.id, user=row.user, uid=row.uid, host=row.host, why=why)
                self.granter.notify(row.id)

    def _drop(self) -> None:
        """Queued requests whose client has been gone past the claim window: dropped, never demand."""
        window = self.config.queue.claim_window
        for row in self.store.in_state("queued"):
            gone = self.granter.presence.absent_for(row.id)
            if gone is None or gone < window:
                continue
            why = f"its client went away and did not come back within the claim window ({window:g} s)"
            if self.store.drop(row.id, why) is not None:
                log.info("request %s of %s dropped: %s", row.id, row.user, why)
                self.audit("request_dropped", request=row.id, user=row.user, uid=row.uid, why=why)
                self.granter.notify(row.id)

    def _strays(self) -> None:
        """Sessions a host may hold for requests that ended while it granted them: asked for again with
        the same request id (the host's checkout finds its session by it) and checked in, each in the
        host's ``change`` lane."""
        for row, host in self.store.strays():
            if host not in self.cache.links:  # the host left the institution: nothing to ask
                self.store.settle_stray(row.id)
            elif self.cache.view(host).reachable:
                self.calls.run(host, "change", partial(self._stray, row, host))

    def _stray(self, row: Row, host: str) -> None:
        link = self.cache.links.get(host)
        if link is None:
            return
        try:
            made = Session.model_validate(
                link.call("checkout", checkout_args(row), request_id=row.id, as_user=row.user)
            )
            if made.ended_at is None:  # else: already given back (a check-in raced this one)
                link.call("checkin", {"id": made.id}, request_id=call_id(), as_user=row.user)
                log.info("checked in session %s on %s, made for %s after it ended", made.id, host, row.id)
                self.audit("stray_checked_in", request=row.id, user=row.user, host=host, session=made.id)
                self.nudge(host)
        except (NothingFreeError, RefusedError, UsageError) as exc:  # it holds nothing for the request
            log.info("host %s holds no session for %s: %s", host, row.id, exc)
        except (CalqueError, OSError, ValueError) as exc:
            log.warning("could not check in what %s made for %s (asked again later): %s", host, row.id, exc)
            return
        self.store.settle_stray(row.id)

    def _lapse(self, row: Row) -> None:
        """A grant its client did not claim within the claim window: the session is given back on its
        host (as its user) and the slice goes to the next in line."""
        assert row.host is not None and row.session_id is not None
        try:
            self.cache.links[row.host].call("checkin", {"id": row.session_id}, request_id=call_id(), as_user=row.user)
        except Exception as exc:  # the host says why; "already ended" is an end too
            if "already ended" not in str(exc) and "no live session" not in str(exc):
                log.warning("could not give back unclaimed %s on %s: %s", row.session_id, row.host, exc)
                return
        self.store.finish(row.id, "lapsed", f"not claimed within {self.config.queue.claim_window:g} s", only=("held",))
        self.store.session_ended(row.host, row.session_id, time.time())
        self.nudge(row.host)
        self.granter.notify(row.id)

    def _match(self, now: float) -> None:
        """Pair free slices with the queue's head, one grant in flight per host (started, not awaited)."""
        queue = self.ordered(now)
        waiting = {w.id for w in queue}
        with self._lock:
            self._busy_at = {k: v for k, v in self._busy_at.items() if k[0] in waiting}
            busy_at = dict(self._busy_at)
        if not queue:
            return
        spare: dict[str, int] = {}  # per profile, free slices beyond what reservations under way hold
        for view in self.cache.views():
            if not view.reachable or self.calls.busy(view.name, "change"):
                continue
            version = self.cache.version(view.name)
            for sl in (s for s in view.slices if offered(s)):  # a drained GPU's free slices go to nobody
                p = sl.slice.profile
                if self.holding is not None and p not in spare:
                    spare[p] = self.holding.spare(p, now) if sl.slice.kind == "mig" else 1 << 30
                pick = next(
                    (
                        w
                        for w in queue
                        if w.matches(sl.slice.kind, sl.slice.profile, view.name, sl.slice.gpu_index)
                        and busy_at.get((w.id, view.name)) != version
                        and not self.granter.refuses_now(w.id, view.name)
                        and (w.reservation is not None or spare.get(p, 1) > 0)
                    ),
                    None,
                )
                if pick is None:
                    continue
                queue.remove(pick)
                if pick.reservation is None and self.holding is not None:
                    spare[p] = spare.get(p, 1) - 1
                if self.holding is not None and not self._capped(pick, p, now):
                    continue
                row = self.store.begin_grant(pick.id, view.name)
                if row is None:  # cancelled or timed out meanwhile
                    continue
                self.calls.run(view.name, "change", partial(self._grant, row, view.name, version))
                break  # this host's next grant once this one is answered (the call's end wakes the loop)
            if not queue:
                return

    def _capped(self, pick: Waiting, profile: str, now: float) -> bool:
        """Cap a waiting request's TTL at the start of an occurrence it would leave short (holding.py);
        False when that start is too near for any use: the slice waits for the reservation."""
        assert self.holding is not None
        if pick.reservation is not None:  # a member's: its session ends by the window's end
            left = self.holding.left(pick.reservation, now)
            if left is None or left < MIN_TTL_S:
                why = f"reservation {pick.reservation}'s window ended before a slice was free"
                if self.store.finish(pick.id, "refused", why, only=("queued",)) is not None:
                    self.granter.notify(pick.id)
                return False
            if pick.ttl is None or pick.ttl > left:
                return (
                    self.store.set_ttl(pick.id, left, f"under reservation {pick.reservation}: it ends with the window")
                    is not None
                )
            return True
        cap = self.holding.cap(profile, pick.ttl, now)
        if cap is None:
            return True
        ttl, why = cap
        if ttl < MIN_TTL_S:
            return False
        return self.store.set_ttl(pick.id, ttl, why) is not None

    def _grant(self, row: Row, host: str, version: int) -> None:
        attempt = self.granter.attempt(row, host, queued=True)  # from the queue: it waited
        if attempt.outcome == "granted":
            if attempt.row is not None:
                self.on_grant(attempt.row)
            self.granter.notify(row.id)
            return
        self.granter.settle(attempt, row)
        self.granter.notify(row.id)
        if attempt.outcome == "busy":
            # The cache was stale, or the host refuses this user such a slot for now (MPS's one user
            # per daemon): list it again, and ask for this request only once it changed.
            with self._lock:
                self._busy_at[(row.id, host)] = version
            self.nudge(host)

    def free_hosts(self, kind: str, profile: str | None, prefer: str | None, gpu: int | None = None) -> list[str]:
        """Reachable hosts with a free matching slice (on GPU ``gpu``, given): ``prefer`` (the user's
        last host) first, then the emptiest (most free matching slices)."""
        scored = []
        for view in self.cache.views():
            n = len(free_matching(view, kind, profile, gpu))
            if n:
                scored.append((view.name != prefer, -n, view.name))
        return [name for _, _, name in sorted(scored)]
