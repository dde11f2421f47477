"""What each broker request does, for a caller the kernel or munge identified.

``anywhere`` tries the hosts the cache shows a free matching slice on (the user's last host first,
then the emptiest) unless requests are already waiting for such a slice (then it joins the queue
behind them, or is answered busy); ``queue`` and ``cancel`` show and end requests (only one's own,
unless an admin). A waiting client's connection stays open: its thread waits on the granter's
condition and answers the moment its request is granted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from calque.errors import NothingFreeError, RefusedError, UnreachableError, UsageError
from calque.models.base import positive_seconds
from calque.models.broker import AnywhereArgs, CancelArgs, Grant, LabStanding, OnHostArgs, QueueArgs, QueueEntry
from calque.models.reservation import ReservationsArgs, ReserveArgs, UnreserveArgs
from calque.models.session import LedgerArgs, Session
from calque.session.broker.broker_ledger import BrokerLedger
from calque.session.broker.callers import Caller
from calque.session.broker.dispatch import Dispatcher
from calque.session.broker.fairness import chosen_lab
from calque.session.broker.grants import Granter
from calque.session.broker.holding import MIN_TTL_S
from calque.session.broker.hosts import HostCache, call_id, free_matching, matching
from calque.session.broker.offers import busy_message, check_offered
from calque.session.broker.reservations import Reservations
from calque.session.broker.rows import ENDED_UNGRANTED
from calque.session.broker.store import NewRequest, Row, Store

WAIT_TICK_S = 0.25  # how often a waiting thread looks whether its client is still there
ENDED_SHOWN_S = 86400.0  # how long `queue` shows a request that ended with nobody told


def args_ttl(args: AnywhereArgs) -> float | None:
    return positive_seconds(args.ttl, "--ttl") if args.ttl is not None else None


class BrokerService:
    def __init__(self, store: Store, cache: HostCache, granter: Granter, dispatcher: Dispatcher) -> None:
        self.store = store
        self.cache = cache
        self.granter = granter
        self.dispatcher = dispatcher
        self.rules = dispatcher.config.queue
        self.ledger: BrokerLedger | None = None  # set by the process (broker_process.py)
        self.labs: Mapping[str, frozenset[str]] = {}  # each lab's groups, institution.yaml's order (broker_process.py)
        self.reservations: Reservations | None = None  # class reservations (broker_process.py)

    # -- checkout --anywhere ------------------------------------------------------------------------

    def anywhere(self, c: Caller, args: AnywhereArgs, alive: Callable[[], bool]) -> Grant | None:
        """A grant for ``c``; None when the client went away while waiting (the request stays queued)."""
        if not args.request_id:
            raise UsageError("checkout --anywhere needs a request_id (the client makes one)")
        row = self.store.get(args.request_id)
        if row is not None and row.uid != c.uid:
            raise RefusedError(f"request id {args.request_id} is another user's; let the client choose its own")
        # Its client is here from before the request is queued (a slow direct try included): a request
        # is never dropped for want of a client between its submit and its wait.
        self.granter.presence.attach(args.request_id)
        try:
            return self._anywhere(c, args, row, alive)
        finally:
            self.granter.presence.detach(args.request_id)

    def _anywhere(self, c: Caller, args: AnywhereArgs, row: Row | None, alive: Callable[[], bool]) -> Grant | None:
        assert args.request_id is not None
        kind, profile = args.kind, args.profile
        if row is None:
            check_offered(self.cache, kind, profile, args.host, args.gpu)
            now = time.time()
            ttl = args_ttl(args)
            wait_for = positive_seconds(args.wait_timeout, "--wait-timeout") if args.wait_timeout is not None else None
            holding = self.dispatcher.holding if kind == "mig" else None
            if args.reservation is not None and holding is None:
                raise UsageError("--reservation is for MIG slices (`calque session reservations` lists them)")
            under = holding.member(c.groups, args.reservation, profile, ttl) if holding is not None else None
            note, held = None, False
            if under is not None:  # a member's, under a reservation under way: its profile, its window
                profile, ttl, note = under.profile, under.ttl, under.note
            elif holding is not None:
                cap = holding.cap(profile, ttl, now)
                if cap is not None:
                    ttl, note = cap
                    held = ttl < MIN_TTL_S  # the window starts now: the slice is the reservation's
                held = held or (holding.any_held(now) if profile is None else holding.spare(profile, now) <= 0)
            req = NewRequest(
                id=args.request_id,
                uid=c.uid,
                user=c.user,
                lab=under.lab if under is not None else self._lab(c, args.lab),
                kind=kind,
                profile=profile,
                ttl=ttl if not held else args_ttl(args),
                consent=args.consent,
                wait=args.wait,
                now=now,
                wait_until=now + wait_for if wait_for is not None else None,
                only_host=args.host,
                reservation=under.reservation.name if under is not None else None,
                note=note if not held else None,
                gpu=args.gpu,
            )
            ahead = [
                w
                for w in self.store.in_state("queued")
                if w.kind == kind
                and (w.profile in (None, profile) or profile is None)
                and (under is None or w.reservation is not None)  # a member goes ahead of the rest
                and (args.gpu is None or w.gpu in (None, args.gpu))  # one for another GPU is not ahead
            ]
            last = self.store.last_host(c.uid)
            free = self.dispatcher.free_hosts(kind, profile, last, args.gpu) if not held else []
            hosts = [
                h for h in free if args.host in (None, h) and not self._contested(h, ahead, kind, profile, args.gpu)
            ]
            if hosts:
                row = self._direct(req, hosts)
            elif args.wait:
                row = self.store.submit(req, max_queued=self.rules.max_queued_per_user)
                self.dispatcher.nudge()
            else:
                why = "; the free ones are held for a reservation under way" if held else ""
                raise NothingFreeError(busy_message(self.cache, kind, profile, len(ahead), args.host, args.gpu) + why)
        return self._outcome(row, alive)

    def _contested(self, host: str, ahead: list[Row], kind: str, profile: str | None, gpu: int | None) -> bool:
        """Whether a request already waiting would take a free matching slice of ``host`` (of its GPU
        ``gpu``, given): a free slice goes to those waiting for it first. One waiting for another GPU
        of the host does not want these."""
        gpus = {s.slice.gpu_index for s in free_matching(self.cache.view(host), kind, profile, gpu)}
        return any(w.only_host in (None, host) and (w.gpu is None or w.gpu in gpus) for w in ahead)

    def _lab(self, c: Caller, asked: str | None) -> str:
        """The lab the request queues for and is billed to: ``--lab`` if the caller is in its groups."""
        try:
            return chosen_lab(c.groups, self.labs, asked) if asked is not None else c.lab
        except ValueError as exc:
            raise RefusedError(str(exc)) from exc

    def _direct(self, req: NewRequest, hosts: list[str]) -> Row:
        """Try each host in turn (the row follows, committed before each call), past busy ones and ones
        that refuse this request; a waiting request none granted is left queued, a direct one answered
        busy, and one that every host offering such a slice refused ends with their words."""
        row = self.store.submit(req, max_queued=self.rules.max_queued_per_user, state="granting", host=hosts[0])
        if row.state != "granting" or row.host != hosts[0]:
            return row  # an earlier send of this request: as it is
        for i, host in enumerate(hosts):
            attempt = self.granter.attempt(row, host, answering=True)
            if attempt.outcome == "granted" and attempt.row is not None:
                self.dispatcher.on_grant(attempt.row)
                return attempt.row
            if attempt.outcome == "busy":
                self.dispatcher.nudge(host)
            passed = attempt.outcome in ("busy", "down", "refused") and not self.granter.record(attempt, row)
            if passed and i + 1 < len(hosts):
                moved = self.store.retarget(row.id, hosts[i + 1])
                if moved is None:
                    break
                row = moved
                continue
            settled = self.granter.settle(attempt, row)
            return settled or row
        return self.store.get(row.id) or row

    def _outcome(self, row: Row, alive: Callable[[], bool]) -> Grant | None:
        woken = self.granter.watch(row.id)
        try:
            return self._wait(row, alive, woken)
        finally:
            self.granter.unwatch(row.id)

    def _wait(self, row: Row, alive: Callable[[], bool], woken: threading.Event) -> Grant | None:
        deadline = row.wait_until
        while True:
            fresh = self.store.get(row.id)
            assert fresh is not None
            row = fresh
            if row.state == "held":
                claimed = self.store.claim(row.id)
                if claimed is not None:
                    return self._grant(claimed)
                continue
            if row.state == "claimed" and row.session is not None:
                return self._grant(row)  # a retried request that was granted: the same grant again
            if row.state in ("refused", "cancelled", "timedout", "lapsed", "claimed", "expired", "dropped"):
                return self._ended(row)
            if deadline is not None and time.time() >= deadline and row.state == "queued":
                if self.store.finish(row.id, "timedout", "waited past --wait-timeout", only=("queued",)) is not None:
                    waited = time.time() - row.enqueued_at
                    raise NothingFreeError(f"{self._busy(row)} (waited {waited:.1f} s)")
                continue
            past = deadline is not None and time.time() >= deadline
            if (not row.wait or past) and row.state == "granting" and not self.granter.busy_with(row.id):
                raise UnreachableError(
                    f"host {row.host} did not answer the checkout; the broker asks it again with the same request "
                    f"id ({row.id}) and gives back, unclaimed, what it grants there; try again"
                )
            if not alive():
                return None
            woken.wait(WAIT_TICK_S)
            woken.clear()

    def _ended(self, row: Row) -> Grant:
        note = row.note or ""
        if row.state == "timedout":  # the loop's timer may get there before this thread does
            waited = time.time() - row.enqueued_at
            raise NothingFreeError(f"{self._busy(row)} (waited {waited:.1f} s)")
        if row.state == "refused" and note.startswith("busy"):
            refused = note.partition("; refused by ")[2]
            raise NothingFreeError(self._busy(row) + (f"; refused by {refused}" if refused else ""))
        raise RefusedError(f"request {row.id} is {row.state}" + (f": {note}" if note else ""))

    def _busy(self, row: Row) -> str:
        return busy_message(self.cache, row.kind, row.profile, 0, row.only_host, row.gpu)

    @staticmethod
    def _grant(row: Row) -> Grant:
        assert row.host is not None and row.session is not None
        note = row.note if row.note and row.note.startswith(("TTL capped", "under reservation ")) else None
        session = Session.model_validate(row.session)
        return Grant(request_id=row.id, host=row.host, session=session, note=note, reservation=row.reservation)

    # -- the queue ----------------------------------------------------------------------------------

    def queue(self, c: Caller, args: QueueArgs) -> list[dict[str, Any]]:
        if args.all and not c.admin:
            raise RefusedError("only root or the admin group see every user's requests; leave out --all")
        now = time.time()
        live = self.store.live()  # one reading: a request queued meanwhile is in neither list, or in both
        ordered = self.dispatcher.ordered(now, live)
        position = {w.id: i + 1 for i, w in enumerate(ordered)}
        out = []
        # Requests that ended with nobody told (dropped: its client gone; expired: its host silent), a day.
        for row in [*live, *self.store.ended_ungranted(now - ENDED_SHOWN_S)]:
            if not (args.all or row.uid == c.uid):
                continue
            e = QueueEntry(
                id=row.id,
                user=row.user,
                uid=row.uid,
                lab=row.lab,
                kind=row.kind,
                profile=row.profile,
                state=row.state,
                enqueued_at=datetime.fromtimestamp(row.enqueued_at, timezone.utc),
                position=position.get(row.id),
                host=row.host or row.only_host,  # queued for one host: that host
                session_id=row.session_id,
                note=row.note if row.state in ENDED_UNGRANTED else None,
                reservation=row.reservation,
                gpu=row.gpu,
            )
            if row.state == "queued":
                e.estimate = self._estimate(row, ordered)
            out.append(e.model_dump(mode="json"))
        return out

    def _estimate(self, row: Row, ordered: list[Any]) -> datetime | None:
        """When the k-th matching slice frees by its holder's deadline, k being the requests ahead of
        this one that want such a slice too."""
        ahead = 0
        for w in ordered:
            if w.id == row.id:
                break
            if w.kind == row.kind and (w.profile is None or row.profile is None or w.profile == row.profile):
                ahead += 1
        ends = sorted(
            s.busy_until
            for v in self.cache.views()
            if row.only_host in (None, v.name)  # asked on one host (and GPU): its slices only
            for s in matching(v, row.kind, row.profile, row.gpu)
            if s.busy and s.busy_until
        )
        return ends[ahead] if ahead < len(ends) else None

    def cancel(self, c: Caller, args: CancelArgs) -> dict[str, Any]:
        row = self.store.get(args.id)
        if row is None:
            raise UsageError(f"no request {args.id}; `calque session queue` lists yours")
        if row.uid != c.uid and not c.admin:
            raise RefusedError(f"request {args.id} is not yours; you can only cancel your own requests")
        done = self.store.cancel(args.id, None if c.admin else c.uid)
        if done is None:
            raise UsageError(
                f"request {args.id} is {row.state}: only a queued request, or one being granted, can be cancelled"
            )
        self.granter.notify(args.id)  # what a host made for a granting one is checked in once it answers
        return {"id": done.id, "state": done.state}

    def on_host(self, c: Caller, args: OnHostArgs) -> Any:
        """Check in, extend or read one of the caller's sessions on another host, as the caller: the
        host checks that it is theirs, exactly as for a call on the host itself."""
        link = self.cache.links.get(args.host)
        if link is None:
            raise UsageError(f"no host {args.host} in the institution; hosts: {', '.join(self.cache.names)}")
        if args.op == "status":
            return link.call("status", {}, request_id=call_id(), as_user=c.user)
        call: dict[str, Any] = {"id": args.session_id}
        capped = None
        if args.op == "extend":
            if args.by is None:
                raise UsageError("extend needs --by")
            call["by"] = args.by
            if self.dispatcher.holding is not None:  # a reservation ahead (or the member's own window)
                by = positive_seconds(args.by, "--by")
                capped = self.dispatcher.holding.extension(args.host, args.session_id, by, time.time())
            if capped is not None:
                if capped[0] < MIN_TTL_S:
                    raise RefusedError(f"not extended: {capped[1]}")
                call["by"] = capped[0]
        answer = link.call(args.op, call, request_id=call_id(), as_user=c.user)
        if args.op == "extend" and isinstance(answer, dict) and isinstance(answer.get("expires_at"), str):
            until = datetime.fromisoformat(answer["expires_at"]).timestamp()
            self.store.session_ended(args.host, args.session_id, until, extended=True)
        if capped is not None and isinstance(answer, dict):
            answer["warnings"] = [*answer.get("warnings", []), f"extended less than asked: {capped[1]}"]
        self.dispatcher.nudge(args.host)
        return answer

    def usage(self, c: Caller, args: LedgerArgs) -> list[dict[str, Any]]:
        """Every host's ledger (``calque report --institution``): the caller's own events unless an admin."""
        if self.ledger is None:
            raise UsageError("this broker keeps no ledger")
        return [h.model_dump(mode="json") for h in self.ledger.collect(str(args.since), c)]

    def lab(self, c: Caller) -> dict[str, Any]:
        """The caller's lab (the one her requests queue for by default) and its budget left this month."""
        lab = c.lab if c.lab in self.labs else None  # "default": in none of the institution's labs
        standing = self.ledger.standing(lab) if self.ledger is not None else LabStanding(lab=lab)
        return standing.model_dump(mode="json")

    def reserving(self, c: Caller, op: str, args: object) -> Any:
        """``reserve``, ``reservations`` and ``unreserve`` (``reservations.py``)."""
        book = self.reservations
        if book is None:
            raise UsageError("this broker keeps no reservations")
        if op == "reserve":
            assert isinstance(args, ReserveArgs)
            answer = book.reserve(c, args)
            self.dispatcher.nudge()  # a window may be near: the queue looks again
            return answer
        if op == "unreserve":
            assert isinstance(args, UnreserveArgs)
            answer = book.cancel(c, args)
            self.dispatcher.nudge()
            return answer
        assert isinstance(args, ReservationsArgs)
        return book.list(c, args)

    def hosts(self, c: Caller) -> list[dict[str, Any]]:
        out = []
        for v in self.cache.views():
            if not c.admin:  # holders are the admins' to see, and the holder's own
                slices = [
                    s
                    if s.holder_uid == c.uid
                    else s.model_copy(update={"holder": None, "holder_uid": None, "session_id": None})
                    for s in v.slices
                ]
                v = v.model_copy(update={"slices": slices})
            out.append(v.model_dump(mode="json"))
        return out
