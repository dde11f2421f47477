"""Sending mail through the relay (``calque.models.mail``), for the broker and the session daemon
alike. Each message is delivered by a thread of its own, so a slow or dead relay never delays a grant
or a reclaim; a relay that refuses is logged (and told to ``on_done``), never retried into a storm."""

from __future__ import annotations

import logging
import smtplib
import threading
from collections.abc import Callable
from email.message import EmailMessage

from calque.models.mail import MailRelay

SMTP_TIMEOUT_S = 10.0

Done = Callable[[str | None], None]  # called once delivery is over: None if the relay took it, else why not


class MailSender:
    def __init__(self, relay: MailRelay, log: logging.Logger) -> None:
        self.relay = relay
        self.log = log

    def post(self, to: str, subject: str, body: str, *, cc: str | None = None, on_done: Done | None = None) -> None:
        msg = EmailMessage()
        msg["From"] = self.relay.sender
        msg["To"] = to
        if cc:
            msg["Cc"] = cc
        msg["Subject"] = subject
        msg.set_content(body)
        threading.Thread(target=self._deliver, args=(msg, on_done), name="calque-mail", daemon=True).start()

    def _deliver(self, msg: EmailMessage, on_done: Done | None) -> None:
        error = None
        try:
            with smtplib.SMTP(self.relay.relay, self.relay.port, timeout=SMTP_TIMEOUT_S) as smtp:
                smtp.send_message(msg)
        except (OSError, smtplib.SMTPException) as exc:
            error = str(exc) or type(exc).__name__
            self.log.warning("mail to %s through %s failed: %s", msg["To"], self.relay.relay, error)
        if on_done is not None:
            try:
                on_done(error)
            except Exception:  # a report that fails (the audit log's disk) must not kill the mail thread loudly
                self.log.exception("recording the mail to %s failed", msg["To"])
