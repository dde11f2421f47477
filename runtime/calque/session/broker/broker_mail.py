"""Mail notices through the institution's SMTP relay: a queued request granted, (from the host
cache's deadlines) a session about to end, and a lab near or over its budget (``broker_ledger.py``). Sent
by ``calque.session.mail_sender`` (a thread per message, so a slow relay never delays a grant; a relay that
refuses is logged, never retried into a storm)."""

from __future__ import annotations

import logging

from calque.models.mail import MailSettings
from calque.session.broker.hosts import HostCache
from calque.session.broker.store import Row, Store
from calque.session.mail_sender import MailSender

log = logging.getLogger("calque.broker")


class Mailer:
    def __init__(self, settings: MailSettings) -> None:
        self.settings = settings
        self.sender = MailSender(settings, log)

    def address(self, user: str) -> str | None:
        return self.settings.address(user)

    def granted(self, row: Row) -> None:
        if not row.wait or row.state != "held":  # answered at once: its client has it on its terminal
            return
        session = row.session or {}
        ref = f"{session.get('id')}@{row.host}"
        body = (
            f"Your queued request {row.id} was granted: session {ref}, slice {session.get('slice_id')} "
            f"({session.get('profile')}) until {session.get('expires_at')}.\n\n"
            f"Use it with: ssh -t {row.host} calque session shell --session {session.get('id')}\n"
            f"Give it back with: calque session checkin {ref}\n"
        )
        self.send(row.user, row.lab, f"[calque] {ref} granted", body)

    def before_end(self, store: Store, cache: HostCache, now: float) -> None:
        """Mail each claimed grant's holder ``before_end`` ahead of its end, by the deadline its host
        lists now (an extension moves it), each threshold once."""
        marks = sorted(self.settings.before_end, reverse=True)
        if not marks:
            return
        deadlines = {
            (v.name, st.session_id): st.busy_until.timestamp()
            for v in cache.views()
            if v.reachable
            for st in v.slices
            if st.session_id and st.busy_until
        }
        for row in store.in_state("claimed"):
            until = deadlines.get((row.host or "", row.session_id or ""))
            if until is None or until <= now:
                continue
            due = [m for m in marks if until - now <= m and (row.mailed_before is None or m < row.mailed_before)]
            if not due:
                continue
            mark = min(due)
            store.mark_mailed(row.id, mark)
            ref = f"{row.session_id}@{row.host}"
            left = max(0, round(until - now))
            body = (
                f"Your session {ref} ends in {left} s. Extend it with: calque session extend {ref} --by 30m\n"
                "(or save your work: the slice is taken back at the deadline)\n"
            )
            self.send(row.user, row.lab, f"[calque] {ref} ends in {left} s", body)

    def send(self, user: str, lab: str, subject: str, body: str) -> None:
        to = self.address(user)
        if to is None:
            return
        self._post(to, self.settings.labs.get(lab), subject, body)

    def lab_notice(self, lab: str, subject: str, body: str) -> None:
        """A notice to the lab itself (its budget): to the lab's list address, if it has one."""
        to = self.settings.labs.get(lab)
        if to is None:
            log.warning("no address for lab %s (mail.labs in broker.yaml): %s not mailed", lab, subject)
            return
        self._post(to, None, subject, body)

    def _post(self, to: str, cc: str | None, subject: str, body: str) -> None:
        self.sender.post(to, subject, body, cc=cc)
