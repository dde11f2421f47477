"""Answers of the session socket's small operations (``ping``, ``whoami``, ``adopt``, ``metrics``) and
``door``: whether checkouts on this host go through the institution's queue now.

``door``'s rule (``session/daemon/door.py``): on a host whose ``institution.yaml`` names a broker,
while the broker answers (it asked this host within ``degraded_after``), a checkout is the broker's
to make (``queue``); once it has been silent that long the host serves directly again
(``degraded``); with no broker named it always does (``direct``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field

from calque.models.base import CalqueModel
from calque.models.session import Session

_DEFERRED = ConfigDict(defer_build=True)

DoorMode = Literal["queue", "degraded", "direct"]


class BrokerPlace(CalqueModel):
    """Where the institution's broker listens, as this host's ``institution.yaml`` names it."""

    model_config = _DEFERRED
    name: str
    address: str
    port: int
    service_user: str


class DoorState(CalqueModel):
    """``door``: how a checkout on this host is made now, and why."""

    model_config = _DEFERRED
    mode: DoorMode
    host: str = Field(description="this host's name in institution.yaml")
    broker: BrokerPlace | None = None
    degraded_after: float = Field(description="seconds of broker silence after which the host serves directly")
    silent_for: float | None = Field(None, description="seconds since the broker last asked this host")
    heard_at: datetime | None = Field(None, description="when the broker last asked this host")

    def describe(self) -> str:
        """One sentence for ``list`` and ``status`` (degraded mode only; the other modes say nothing)."""
        silent = f"{self.silent_for:.0f} s" if self.silent_for is not None else "since this daemon started"
        return (
            f"degraded mode: the institution's broker has not answered this host for {silent} "
            f"(bound {self.degraded_after:g} s); checkouts here are served directly, outside the queue, "
            "and counted for your lab when the broker returns"
        )


class Pong(CalqueModel):
    model_config = _DEFERRED
    pong: bool


class WhoAmI(CalqueModel):
    model_config = _DEFERRED
    uid: int
    gid: int
    user: str
    admin: bool
    pid: int


class Adopted(CalqueModel):
    """``adopt``: the caller's process is in the session's cgroup; ``env`` is what it runs with."""

    model_config = _DEFERRED

    session: Session
    env: dict[str, str]
    cgroup: str


class MetricsText(CalqueModel):
    """``metrics``: the Prometheus exposition (holders by user for admins, counts for everyone else)."""

    model_config = _DEFERRED

    text: str
