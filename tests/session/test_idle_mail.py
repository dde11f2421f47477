"""The idle reclaim's warning by mail (``mail`` in session.yaml), through a real SMTP sink (aiosmtpd) on
127.0.0.1, from a real daemon, to real second users: it arrives before the idle end and says which
session, which slice and when it ends; a relay that refuses one holder's address costs her the mail,
never the reclaim; both are in the audit trail."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from calque.errors import UsageError
from calque.session.session_config import load_config

from .conftest import Host, User, wait_for
from .test_idle_reclaim import _checkout, _ended_at, _events

pytestmark = pytest.mark.slow

REFUSED = "nobody@refused.example"


class _Relay:
    """A real SMTP server's handler that keeps each message with when it came, and refuses REFUSED."""

    def __init__(self) -> None:
        self.messages: list[tuple[float, Any]] = []

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:
        if address == REFUSED:
            return "550 no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        from email import message_from_bytes, policy

        self.messages.append((time.time(), message_from_bytes(envelope.content, policy=policy.default)))
        return "250 OK"


def test_the_idle_warning_is_mailed_to_the_holder_before_the_end_and_a_refused_one_keeps_nothing(
    host: Host, make_user: Callable[..., User]
) -> None:
    from aiosmtpd.controller import Controller

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    relay = _Relay()
    smtp = Controller(relay, hostname="127.0.0.1", port=port)
    smtp.start()
    alice, bob = make_user(), make_user()
    try:
        mail = {"relay": "127.0.0.1", "port": port, "domain": "example.edu", "users": {bob.name: REFUSED}}
        host.start(idle={"below": "5%", "for": "4s", "warn": "3s", "memory_from": None}, mail=mail, host_name="gpu7")
        hers, his = _checkout(host, alice), _checkout(host, bob)
        assert wait_for(lambda: bool(_events(host, hers["id"], "idle")) and bool(_events(host, his["id"], "idle")))
        # Alice (USER@domain): mailed once, before her end, naming the session, the slice and the end.
        assert wait_for(lambda: bool(_events(host, hers["id"], "idle_mail")))
        ((at, msg),) = relay.messages
        assert msg["To"] == f"{alice.name}@example.edu" and msg["From"] == "calque@localhost"
        assert at < _ended_at(host, hers["id"]), (at, _ended_at(host, hers["id"]))
        created = datetime.fromisoformat(hers["created_at"]).timestamp()
        body = msg.get_content()
        assert hers["id"] in msg["Subject"] and "gpu7" in msg["Subject"]
        assert hers["id"] in body and hers["slice_id"] in body and "has been idle" in body
        said = re.search(r"ends at (\S+) \(in ", body)
        assert said is not None, body
        # Her end as the daemon counts it: ``for`` after her idle clock, her checkout (never active).
        assert datetime.fromisoformat(said[1]).timestamp() == pytest.approx(created + 4, abs=1.0), (said[1], created)
        (sent,) = _events(host, hers["id"], "idle_mail")
        assert sent["reason"] == "sent" and sent["to"] == f"{alice.name}@example.edu"
        # Bob (listed in mail.users): the relay refused his address; his slice was taken back all the same.
        assert wait_for(lambda: bool(_events(host, his["id"], "idle_mail")))
        (refused,) = _events(host, his["id"], "idle_mail")
        assert refused["to"] == REFUSED and refused["reason"].startswith("not sent:"), refused
        assert [m["To"] for _, m in relay.messages] == [f"{alice.name}@example.edu"]
    finally:
        smtp.stop()


def test_a_wrong_mail_section_is_refused_with_what_is_wrong(tmp_path: Path) -> None:
    cfg = tmp_path / "session.yaml"
    for mail, says in (
        ("{port: 25}", "mail.relay: Field required"),
        ("{relay: smtp, port: 0}", "mail.port=0: Input should be greater than or equal to 1"),
        ("{relay: smtp, labs: {lab-a: a@x}}", "mail.labs={'lab-a': 'a@x'}: Extra inputs are not permitted"),
    ):
        cfg.write_text(f"version: 1\nmail: {mail}\n")
        with pytest.raises(UsageError, match=re.escape(says)):
            load_config(cfg)
    cfg.write_text("version: 1\nmail: {relay: smtp.example.edu, domain: example.edu, users: {alice: al@lab.example}}\n")
    relay = load_config(cfg).mail
    assert relay is not None and relay.port == 25  # the broker's rule: users, else USER@domain
    assert (relay.address("alice"), relay.address("bob")) == ("al@lab.example", "bob@example.edu")
