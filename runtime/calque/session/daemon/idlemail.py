"""The idle reclaim's warning by mail (``mail`` in session.yaml): sent with the terminal notice, once
per idle stretch, to the holder's address by the broker's rule (``mail.users``, else USER@``domain``).
Delivery is a thread of its own (``calque.session.mail_sender``): a relay that is slow, down or refusing
delays nothing here and never keeps a slice; what became of each mail is an ``idle_mail`` line in the
audit trail."""

from __future__ import annotations

import logging
import socket
from datetime import datetime, timezone

from calque.durations import format_duration
from calque.models.mail import MailRelay
from calque.session.daemon.audit import AuditLog
from calque.session.daemon.rows import Held
from calque.session.mail_sender import MailSender

log = logging.getLogger("calque.session")


class IdleMail:
    def __init__(self, relay: MailRelay, audit: AuditLog, host_name: str | None) -> None:
        self.relay = relay
        self.audit = audit
        self.host = host_name or socket.gethostname()
        self.sender = MailSender(relay, log)

    def warn(self, h: Held, idle_for: float, ends_at: float, now: float, why: str, checkpoint: str | None) -> None:
        s = h.session
        to = self.relay.address(s.user)
        if to is None:
            log.info(
                "no mail address for %s (mail.users or mail.domain in session.yaml): idle warning not mailed", s.user
            )
            self.audit.record("idle_mail", h, by_uid=0, reason="no address (mail.users or mail.domain)", to=None)
            return
        end = datetime.fromtimestamp(ends_at, tz=timezone.utc).replace(microsecond=0)
        left = format_duration(max(0, round(ends_at - now)))  # whole seconds: a mail is read in minutes
        subject = f"[calque] idle session {s.id} on {self.host} ends at {end:%H:%M:%S} UTC"
        body = (
            f"Your session {s.id} on {self.host} holds slice {s.slice_id} ({s.profile}), which has been idle "
            f"({why}) for {format_duration(round(idle_for))}.\n\n"
            f"It ends at {end.isoformat()} (in {left}) unless its slice gets busy: the slice is taken back for "
            "others then, and your processes on it are ended.\n"
            "`calque session extend` does not reset the idle clock; work on the GPU does.\n"
        )
        if checkpoint is not None:
            body += f"Before the end your session's processes get {checkpoint} to save their work.\n"
        body += f"\nGive it back now, on {self.host}: calque session checkin {s.id}\n"

        def done(error: str | None) -> None:
            self.audit.record(
                "idle_mail", h, by_uid=0, reason="sent" if error is None else f"not sent: {error}", to=to,
                relay=f"{self.relay.relay}:{self.relay.port}", ends_at=end.isoformat(),
            )  # fmt: skip

        self.sender.post(to, subject, body, on_done=done)
