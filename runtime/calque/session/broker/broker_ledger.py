"""The institution's ledger at the broker: every host's usage events (``calque report --institution``)
and each lab's month against its budget, with a mail to the lab at its notice share and at 100 %.

The broker asks each host's daemon for its ledger (as itself: every user's events, or as the caller
for a non-admin) and keeps each host's last full answer. A host that does not answer is reported from
that copy, marked stale, its events kept to the caller's own for a non-admin; a host that never
answered is listed stale with no events, never left out. Every ``ledger_every`` seconds the broker
takes the month to date of every host (a fresh copy of each) and, where ``broker.yaml`` names the
pools' region (``pools``), of every lab's pools from their usage records; sums each budgeted lab (one
figure: ``ledger/budgets.py``'s ``lab_month``), mails it once a month per state (``notice``,
``over``), tells each host the rest of the figure (its checkout and extend gates add it to their own
sessions) and holds an over-budget lab's pools at their running claims (``pool_budgets.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from pydantic import ValidationError

from calque.errors import CalqueError
from calque.ledger.budgets import budget_left, lab_month, month_of, month_start, refusal, when_spent
from calque.models.broker import LabStanding
from calque.models.institution import Lab
from calque.models.ledger import HostLedger, LabSpend, UsageEvent
from calque.session.broker.callers import Caller
from calque.session.broker.hosts import HostLink, call_id
from calque.session.broker.store import Store

if TYPE_CHECKING:
    from calque.session.broker.broker_mail import Mailer
    from calque.session.broker.pool_budgets import PoolBudgets

log = logging.getLogger("calque.broker")
EPOCH = datetime.fromtimestamp(0, tz=timezone.utc)


class BrokerLedger:
    def __init__(
        self,
        store: Store,
        links: Mapping[str, HostLink],
        labs: list[Lab],
        mailer: Mailer | None,
        pools: PoolBudgets | None = None,
    ) -> None:
        self.store = store
        self.pools = pools  # None: the months are sessions only
        self.links = dict(links)
        self.labs = [lab for lab in labs if lab.budget is not None]
        self.mailer = mailer  # None: notices are only logged
        self.last: list[LabSpend] = []  # the latest round's month per lab (the metrics endpoint shows it)
        self.last_at: float | None = None  # when that round was summed; None: no round yet
        self._summing = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _ask(self, name: str, since: str, as_user: str | None) -> HostLedger:
        link = self.links[name]
        answer = HostLedger.model_validate(link.call("ledger", {"since": since}, request_id=call_id(), as_user=as_user))
        if as_user is None:  # a full answer: what a stale report of this host shows
            self.store.save_ledger(name, answer.taken_at.timestamp(), answer.model_dump_json())
        return answer

    def _stale(self, name: str, user: str | None) -> HostLedger:
        body = self.store.last_ledger(name)
        now = datetime.now(timezone.utc)
        if body is None:
            return HostLedger(host=name, taken_at=EPOCH, since=EPOCH, until=now, events=[], stale=True)
        try:
            last = HostLedger.model_validate_json(body)
        except ValidationError:  # written by another calque: reported as never answered, not dropped
            return HostLedger(host=name, taken_at=EPOCH, since=EPOCH, until=now, events=[], stale=True)
        events = last.events if user is None else [e for e in last.events if e.user == user]
        return last.model_copy(update={"events": events, "stale": True, "budgets": []})

    def collect(self, since: str, c: Caller | None = None) -> list[HostLedger]:
        """Every host's ledger over ``since``: fresh where the host answers, its last copy (stale) where not."""
        as_user = None if c is None or c.admin else c.user
        out: list[HostLedger] = []
        for name in sorted(self.links):
            try:
                out.append(self._ask(name, since, as_user))
            except (CalqueError, ValidationError) as exc:
                log.warning("ledger of host %s: %s; reporting its last answer as stale", name, exc)
                out.append(self._stale(name, as_user))
        return out

    def spends(self, now: float | None = None) -> list[LabSpend]:
        """Each budgeted lab's month to date, institution-wide (overrides are per host: the largest counts);
        each host that answered is told what the labs used on the others (its checkout gate adds it)."""
        t = datetime.fromtimestamp(now if now is not None else time.time(), tz=timezone.utc)
        since = max(1.0, t.timestamp() - month_start(t).timestamp())
        hosts = self.collect(f"{since:.0f}")
        pools = self.pools.events(t.timestamp()) if self.pools is not None else []
        events = [e for h in hosts for e in h.events]
        out = []
        for lab in self.labs:
            extra = max((b.extra for h in hosts for b in h.budgets if b.lab == lab.name), default=0.0)
            out.append(lab_month(lab, events, pools, t, extra))
        for h in hosts:
            if not h.stale:
                self._tell(h.host, t, [x for x in hosts if x.host != h.host], pools)
        return out

    def _tell(self, name: str, t: datetime, others: list[HostLedger], pools: list[UsageEvent]) -> None:
        """The labs' months on the other hosts and in their pools: what this host's gates add to its own."""
        labs = {}
        for lab in self.labs:
            mine = [e for h in others for e in h.events if e.lab == lab.name] + [e for e in pools if e.lab == lab.name]
            gpu_h = sum(e.gpu_seconds for e in mine) / 3600.0
            labs[lab.name] = {"gpu_hours": gpu_h, "usd": sum(e.ec2_usd or 0.0 for e in mine)}
        try:
            self.links[name].call("budget_elsewhere", {"month": month_of(t), "labs": labs}, request_id=call_id())
        except CalqueError as exc:
            log.warning("could not tell host %s the labs' use elsewhere: %s", name, exc)

    def standing(self, lab: str | None) -> LabStanding:
        """``lab``'s month as the latest budget round summed it (the hub's options form). Before the first
        round (a broker just started) one is summed now, once for every caller waiting on it; a form never
        asks the hosts otherwise, so a hub full of forms costs the hosts nothing."""
        if lab is None or all(b.name != lab for b in self.labs):
            return LabStanding(lab=lab)
        with self._summing:
            if self.last_at is None:
                at = time.time()
                self.last, self.last_at = self.spends(at), at
            spends, at = self.last, self.last_at
        spend = next((s for s in spends if s.lab == lab), None)
        if spend is None:
            return LabStanding(lab=lab)
        return LabStanding(
            lab=lab,
            spend=spend,
            left=budget_left(spend),
            when_spent=when_spent(spend),
            as_of=datetime.fromtimestamp(at, tz=timezone.utc),
        )

    def check_budgets(self, now: float | None = None) -> list[LabSpend]:
        """Mail each lab that reached its notice share or its budget, once a month per state."""
        at = now if now is not None else time.time()
        spends = self.spends(at)
        with self._summing:
            self.last, self.last_at = spends, at
        if self.pools is not None:  # the pool side of the one budget, between playbook runs
            self.pools.enforce(spends)
        for s in spends:
            if s.state not in ("notice", "over") or not self.store.first_budget_notice(s.lab, s.month, s.state, at):
                continue
            used = s.gpu_hours if s.unit == "GPU-hours" else s.ec2_usd
            if s.state == "over":
                subject, body = f"[calque] lab {s.lab} has spent its budget for {s.month}", refusal(s) + "\n"
            else:
                subject = f"[calque] lab {s.lab} has used {s.used:.0%} of its budget for {s.month}"
                body = (
                    f"Lab {s.lab} has used {used:.2f} of its {s.limit:g} {s.unit} budget for {s.month} "
                    f"({s.used:.0%}). At 100 % its members' new checkouts are refused; {s.raised_by} can raise it.\n"
                )
            log.info("budget notice: %s", subject)
            if self.mailer is not None:
                self.mailer.lab_notice(s.lab, subject, body)
        return spends

    def start(self, every: float) -> None:
        if not self.labs:
            return

        def loop() -> None:
            while not self._stop.wait(every):
                try:
                    self.check_budgets()
                except Exception:  # a broken round is logged; the next one tries again
                    log.exception("budget check failed")

        self._thread = threading.Thread(target=loop, name="broker-budgets", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
