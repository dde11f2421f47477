"""Mail through the institution's SMTP relay: where it goes and to whom, read by the broker
(``broker.yaml``'s ``mail``: grants, ends, budgets) and by each host's session daemon
(``session.yaml``'s ``mail``: the idle reclaim's warning). Sent by ``calque.session.mail_sender``."""

from __future__ import annotations

from pydantic import Field

from calque.models.base import CalqueModel, Seconds


class MailRelay(CalqueModel):
    """An SMTP relay inside the institution (no authentication) and each user's address."""

    relay: str = Field(min_length=1, description="the relay's host name or address")
    port: int = Field(25, ge=1, le=65535)
    sender: str = Field("calque@localhost", min_length=1, description="the From: address")
    domain: str | None = Field(None, min_length=1, description="a user's address is USER@DOMAIN unless listed in users")
    users: dict[str, str] = Field(default_factory=dict, description="user name to address")

    def address(self, user: str) -> str | None:
        """The user's own address (``users``, else USER@``domain``); None: the user is not mailed."""
        return self.users.get(user) or (f"{user}@{self.domain}" if self.domain else None)


class MailSettings(MailRelay):
    """The broker's mail: the relay, and the labs' list addresses and when before an end to mail."""

    labs: dict[str, str] = Field(default_factory=dict, description="lab name to a list address (copied on notices)")
    before_end: list[Seconds] = Field(default_factory=lambda: [600.0, 60.0], description="mail this long before an end")
