"""Contracts of the institution (Layer 2 across hosts): ``/etc/calque/institution.yaml`` and the
request envelope a host daemon's TCP listener accepts.

The file names the institution's session hosts, the broker (its address and the service user whose
munge credentials may act for other users) and the labs (Unix groups and their share). The role writes
it from inventory; host daemons and the broker read it.

A ``RemoteRequest`` is one request crossing hosts: the operation and its arguments, the request id,
the host it is for, the user who made it and the user it acts for, and a munge credential made by the
sender's own process whose payload is ``binding()``: a hash of the canonical JSON of everything else,
so a body changed after signing, or sent to another host, no longer matches it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar

from pydantic import ConfigDict, Field, StrictInt, StrictStr, model_validator

from calque.models.base import BindAddress, CalqueModel, VersionedModel
from calque.models.session import SessionOp
from calque.models.versions import SESSION_PROTOCOL_VERSION

INSTITUTION_VERSION = 1
_DEFERRED = ConfigDict(defer_build=True)

HostName = Annotated[StrictStr, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
UserName = Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\$?$")]
Port = Annotated[StrictInt, Field(ge=1, le=65535)]

BINDING_PREFIX = b"calque-session-1:"  # what a credential's payload starts with (then the hex digest)
NUDGE_PREFIX = b"calque-nudge-1:"  # a host daemon's nudge to the broker: its credential's payload, then the host


class InstitutionHost(CalqueModel):
    """One session host: where its daemon listens on TCP and what it offers (MIG profiles, ``mps``)."""

    name: HostName
    address: BindAddress
    port: Port = 7461
    offers: list[Annotated[StrictStr, Field(min_length=1, max_length=64)]] = Field(default_factory=list)
    service_user: UserName = Field("root", description="the user its session daemon runs as (it seals each answer)")


class Broker(CalqueModel):
    """The front door: where it listens and the user it runs as (its uid may act for other users)."""

    name: HostName = Field(
        "broker", description="the front-door host's name: a researcher's credential is bound to it (target)"
    )
    address: BindAddress
    port: Port = 7460
    service_user: UserName = Field("root", description="the broker's Unix user, the same name on every host")


class Hub(CalqueModel):
    """The institution's JupyterHub (``calque.jupyterhub``): the user it runs as may ask the broker for a
    slice for a named user, and a host for that user's notebook server in her session, her sessions
    and her check-in; nothing else in anyone's name (``docs/session.md``, Threat model)."""

    service_user: UserName = Field(description="the hub's Unix user, the same name on every host")


class LabBudget(CalqueModel):
    """A lab's monthly budget (``calque_labs.<lab>.budget``): GPU-hours, or dollars at EC2 rates.

    At ``notify_at`` of it the lab is mailed once a month; at 100 % its members' new checkouts are
    refused and the refusal names ``raised_by``, who can raise it (or grant an audited override)."""

    gpu_hours: float | None = Field(None, gt=0, description="GPU-hours per calendar month (UTC)")
    usd: float | None = Field(None, gt=0, description="dollars per calendar month at EC2 on-demand rates")
    notify_at: float = Field(0.8, gt=0, lt=1, description="the share of the budget at which the lab is told")
    raised_by: Annotated[StrictStr, Field(min_length=1, max_length=200)] = Field(
        "your institution's GPU administrators", description="who can raise the budget (a name or an address)"
    )

    @model_validator(mode="after")
    def _one_unit(self) -> LabBudget:
        if (self.gpu_hours is None) == (self.usd is None):
            raise ValueError("a lab's budget is gpu_hours or usd per month: give exactly one")
        return self

    @property
    def unit(self) -> str:
        return "GPU-hours" if self.gpu_hours is not None else "USD"

    @property
    def limit(self) -> float:
        return self.gpu_hours if self.gpu_hours is not None else float(self.usd or 0.0)


class Lab(CalqueModel):
    name: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    groups: list[UserName] = Field(min_length=1, description="the lab's Unix groups")
    share: float = Field(1.0, gt=0, description="the lab's share of the institution's slices (relative weight)")
    budget: LabBudget | None = Field(None, description="the lab's monthly budget; none: unlimited")
    managers: list[UserName] = Field(
        default_factory=list, description="users who may reserve slices for the lab (calque session reserve)"
    )


class Institution(VersionedModel):
    version_label: ClassVar[str] = "institution file"
    upgrade_hint: ClassVar[str] = "upgrade calque on this host, or write the file's older version"
    version: int = INSTITUTION_VERSION
    hosts: list[InstitutionHost] = Field(default_factory=list)
    broker: Broker | None = None
    hub: Hub | None = None
    labs: list[Lab] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> Institution:
        for what, names in (("host", [h.name for h in self.hosts]), ("lab", [lab.name for lab in self.labs])):
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"{what} names must be unique; repeated: {', '.join(dup)}")
        return self

    def host(self, name: str) -> InstitutionHost | None:
        return next((h for h in self.hosts if h.name == name), None)

    def lab(self, name: str) -> Lab | None:
        return next((lab for lab in self.labs if lab.name == name), None)

    def lab_of(self, groups: Iterable[str]) -> Lab | None:
        """The lab of a user in ``groups``: the first lab (in the file's order) naming one of them."""
        have = set(groups)
        return next((lab for lab in self.labs if have & set(lab.groups)), None)


class SignedEnvelope(VersionedModel):
    """One request crossing hosts, one JSON object on one line: what a host daemon's TCP listener
    (``RemoteRequest``) and the broker's (``models.broker.RemoteBrokerRequest``) accept. Each adds its
    ``op``; the credential's payload binds it with everything else."""

    model_config = _DEFERRED

    upgrade_hint: ClassVar[str] = "upgrade calque on both hosts so their daemons and clients speak the same version"
    version_label: ClassVar[str] = "protocol"
    version: StrictInt = SESSION_PROTOCOL_VERSION
    op: str
    args: dict[str, Any] = Field(default_factory=dict)
    request_id: Annotated[StrictStr, Field(min_length=8, max_length=128)]
    host: HostName = Field(description="the host this request is for (a credential for another host is refused)")
    user: UserName = Field(description="the sender's user name (its uid must be the credential's on the receiver)")
    as_user: UserName | None = Field(None, description="the user the request acts for (the broker only)")
    credential: Annotated[StrictStr, Field(min_length=1, max_length=4096)]

    def binding(self) -> bytes:
        """What the credential's payload must be: a hash of everything but the credential."""
        return binding(self.op, self.args, self.request_id, self.host, self.user, self.as_user)


class RemoteRequest(SignedEnvelope):
    """One request on a host daemon's TCP listener."""

    op: SessionOp


def binding(op: str, args: dict[str, Any], request_id: str, host: str, user: str, as_user: str | None) -> bytes:
    body = {"op": op, "args": args, "request_id": request_id, "host": host, "user": user, "as_user": as_user}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return BINDING_PREFIX + hashlib.sha256(canonical.encode()).hexdigest().encode()
