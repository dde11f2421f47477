"""Contracts of the institution's front door (the broker): its requests, its queue, its answers.

The broker (``calque.session.broker``) holds the waiting queue and a cache of what every host has
free; the host daemons stay authoritative for sessions. What crosses the broker's socket is defined
here once, for the researcher's client (``calque.session.client.broker``) and the broker alike. The
envelopes are the session protocol's (``SessionResponse``), with the broker's own ops.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictStr, model_validator

from calque.models.base import CalqueModel, Duration, VersionedModel, positive_seconds
from calque.models.institution import SignedEnvelope, UserName
from calque.models.ledger import LabSpend
from calque.models.reservation import ReservationName, ReservationsArgs, ReserveArgs, UnreserveArgs
from calque.models.session import (
    CheckoutArgs,
    LedgerArgs,
    Session,
    SliceState,
)
from calque.models.versions import SESSION_PROTOCOL_VERSION

_DEFERRED = ConfigDict(defer_build=True)

BrokerOp = Literal[
    "anywhere",
    "queue",
    "cancel",
    "hosts",
    "nudge",
    "ping",
    "on_host",
    "ledger",
    "lab",
    "reserve",
    "reservations",
    "unreserve",
]
# queued: waiting its turn; granting: a checkout on ``host`` is under way (retried there, and only
# there, after a crash: the host's checkout is idempotent by request id); held: granted, waiting for
# its client to claim it; claimed: its client has it; the rest are ends: lapsed (held past the claim
# window), cancelled, timedout (--wait-timeout), refused (no host could ever grant it), expired (its
# host stayed silent past queue.granting_for), dropped (its client went away past the claim window).
RequestState = Literal[
    "queued", "granting", "held", "claimed", "lapsed", "cancelled", "timedout", "refused", "expired", "dropped"
]
LIVE_STATES: tuple[RequestState, ...] = ("queued", "granting", "held")
_SAFE_ID = re.compile(r"[A-Za-z0-9_.-]{8,64}")
RequestId = Annotated[StrictStr, Field(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]


class BrokerRequest(VersionedModel):
    """One request on the broker's socket: one JSON object on one line."""

    model_config = _DEFERRED
    upgrade_hint: ClassVar[str] = "upgrade calque here or on the front-door host so both speak the same version"
    version_label: ClassVar[str] = "protocol"
    version: int = SESSION_PROTOCOL_VERSION
    op: BrokerOp
    args: dict[str, object] = Field(default_factory=dict)
    # The institution's hub only (institution.yaml's hub.service_user), for HUB_BROKER_OPS: the user it
    # asks for (``broker/hub.py``); from anyone else the request is refused.
    as_user: UserName | None = None


class RemoteBrokerRequest(SignedEnvelope):
    """One request on the broker's TCP port, from a researcher on another host: a ``BrokerRequest``
    with a munge credential made by the researcher's own process, bound to it and to the broker's
    name (``host``). ``as_user`` is refused from everyone but the institution's hub (``broker/hub.py``)."""

    op: BrokerOp

    def plain(self) -> BrokerRequest:
        return BrokerRequest.model_validate({"op": self.op, "args": self.args, "as_user": self.as_user})


class AnywhereArgs(CheckoutArgs):
    """``checkout --anywhere``: a checkout's own rules, plus whether to join the queue."""

    model_config = _DEFERRED
    wait: StrictBool = False
    wait_timeout: Duration | None = None
    # A plain checkout on a host of the institution: that host's slices only (this host or wait for
    # it, in the queue's order), with ``gpu`` that GPU's of it; None: any host (and no ``gpu``).
    host: Annotated[StrictStr, Field(min_length=1, max_length=253)] | None = None
    # A member's checkout under a class reservation (issue 38); None: the one under way for a group
    # of the caller's, if any, applies by itself.
    reservation: ReservationName | None = None

    @model_validator(mode="after")
    def _anywhere(self) -> AnywhereArgs:
        if self.direct:
            raise ValueError("--direct is a host's admin override; the broker's checkouts keep its queue")
        if self.request_id is not None and not _SAFE_ID.fullmatch(self.request_id):
            raise ValueError("request_id must be 8 to 64 letters, digits, '.', '_' or '-'")
        if self.gpu is not None and self.host is None:  # on a host of the institution: that host's GPU
            raise ValueError("--gpu names a GPU of one host; leave it out with --anywhere")
        if self.wait_timeout is not None:
            positive_seconds(self.wait_timeout, "--wait-timeout")
            if not self.wait:
                raise ValueError("--wait-timeout needs --wait")
        return self


class QueueArgs(CalqueModel):
    model_config = _DEFERRED
    all: StrictBool = Field(False, description="every user's requests (admins only)")


class CancelArgs(CalqueModel):
    model_config = _DEFERRED
    id: RequestId


class NudgeArgs(CalqueModel):
    """A host daemon's word that a slice there was taken or freed: the broker polls that host."""

    model_config = _DEFERRED
    host: Annotated[StrictStr, Field(min_length=1, max_length=253)]


class OnHostArgs(CalqueModel):
    """One of the caller's own sessions on another host, by ``SESSION@HOST``: the broker makes the call
    on that host as the caller (never as anyone else)."""

    model_config = _DEFERRED
    ref: Annotated[StrictStr, Field(min_length=3, max_length=320, pattern=r"^[A-Za-z0-9_.-]+@[A-Za-z0-9_.-]+$")]
    op: Literal["checkin", "extend", "status"]
    by: Duration | None = None

    @property
    def session_id(self) -> str:
        return self.ref.split("@", 1)[0]

    @property
    def host(self) -> str:
        return self.ref.split("@", 1)[1]


BROKER_REQUESTS: dict[str, type[CalqueModel]] = {
    "anywhere": AnywhereArgs,
    "queue": QueueArgs,
    "cancel": CancelArgs,
    "hosts": CalqueModel,
    "nudge": NudgeArgs,
    "ping": CalqueModel,
    "on_host": OnHostArgs,
    "ledger": LedgerArgs,  # every host's usage events (calque report --institution)
    "lab": CalqueModel,  # the caller's lab and its budget left (the hub's options form)
    "reserve": ReserveArgs,  # class reservations (issue 38)
    "reservations": ReservationsArgs,
    "unreserve": UnreserveArgs,
}


class Grant(CalqueModel):
    """A checkout the broker made for its caller: which host, and the session as that host has it."""

    model_config = _DEFERRED
    request_id: str
    host: str
    session: Session
    note: str | None = Field(None, description="why its TTL is shorter than asked (a reservation's window)")
    reservation: str | None = Field(None, description="the reservation it was granted under")

    @property
    def ref(self) -> str:
        """The session's id naming its host: what ``checkin``/``extend``/``env`` take from anywhere."""
        return f"{self.session.id}@{self.host}"


class QueueEntry(CalqueModel):
    """One request of the queue, as its owner (or an admin) sees it."""

    model_config = _DEFERRED
    id: str
    user: str
    uid: int
    lab: str
    kind: Literal["mig", "mps"]
    profile: str | None = None
    state: RequestState
    enqueued_at: datetime
    position: int | None = Field(None, description="1 is next (queued requests only)")
    estimate: datetime | None = Field(None, description="when a matching slice may free, from holders' deadlines")
    host: str | None = None
    session_id: str | None = None
    note: str | None = Field(None, description="why it waits, or why it ended (a request that ended ungranted)")
    reservation: str | None = Field(None, description="a member's, under this reservation: ahead of the queue")
    gpu: int | None = Field(None, description="asked with --gpu on its host: that GPU's slices only")


class HostView(CalqueModel):
    """What the broker's cache holds of one host: its slices as last seen, and whether it answers."""

    model_config = _DEFERRED
    name: str
    reachable: bool
    seen_at: datetime | None = None
    error: str | None = None
    slices: list[SliceState] = Field(default_factory=list)


class LabStanding(CalqueModel):
    """``lab``: the caller's lab and its month against its budget, as the broker's last budget round
    summed it (every host's sessions plus the lab's pools: ``broker_ledger.py``). What the hub's options
    form shows her before she asks for a slice."""

    model_config = _DEFERRED
    lab: str | None = Field(None, description="the lab her requests queue for and are billed to; None: in no lab")
    spend: LabSpend | None = Field(None, description="its month to date against its budget; None: no budget")
    left: float | None = Field(None, description="what is left this month (overrides included), in the budget's unit")
    when_spent: str | None = Field(None, description="what happens once it is spent, in the words of the refusal")
    as_of: datetime | None = Field(None, description="when the broker summed the figure (its budget round)")
