"""Contracts of an elastic class of session hosts (issue 25): what inventory declares, what crosses.

A class (``teaching-rtx6000``) is one Auto Scaling group of identical session hosts. Its AWS names
are those of the pool ``fleet/<class>`` (``calque.models.pool_names``), so the Acquirer's template,
group, spend gate and ``calque:pool`` ownership apply to it unchanged; every name below that is not
an AWS resource's (the demand metric, the registration path) derives from the class alone.

- ``DemandSettings``: the broker's side (``broker.yaml``'s ``fleet``): which classes offer what,
  how long a request waits before it counts as demand, where the metric goes.
- ``HostRegistration``: what a booted host of a class writes under ``registration_path(class)``
  (an SSM parameter per instance) and the broker reads to reach it.
- ``MungeKeySource``: where a class's hosts fetch the institution's munge key (an SSM SecureString
  or an S3 object with SSE), the one secret their instance profile may read.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, StrictStr, model_validator

from calque.models.base import BindAddress, CalqueModel, Seconds
from calque.models.imds_address import IMDS_ENDPOINT

CLASS_RULE = r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$"
ClassName = Annotated[StrictStr, Field(pattern=CLASS_RULE, description="a session-host class, e.g. teaching-rtx6000")]

DEMAND_NAMESPACE = "calque/session"
DEMAND_METRIC = "UnservedRequests"
"""Requests waiting longer than ``wait_s`` that no running host of the class can serve (a count)."""
CLASS_DIMENSION = "Class"
REGISTRATION_ROOT = "/calque/session-fleet"
FLEET_TAG = "calque:session-class"


def fleet_pool(name: str) -> str:
    """The pool name whose AWS names a class's template, group, role and alarms carry."""
    if not re.fullmatch(CLASS_RULE, name):
        raise ValueError(f"session-host class {name!r}: use 1-40 of a-z 0-9 '-', starting and ending alphanumeric")
    return f"fleet/{name}"


def registration_path(name: str) -> str:
    """The SSM path under which each host of class ``name`` registers (one parameter per instance)."""
    fleet_pool(name)
    return f"{REGISTRATION_ROOT}/{name}/hosts"


def serves(offers: list[str], kind: str, profile: str | None) -> bool:
    """Whether a host offering ``offers`` (MIG profiles, ``mps``) could ever serve such a request."""
    if kind == "mps":
        return "mps" in offers
    mig = [o for o in offers if o != "mps"]
    return bool(mig) and (profile is None or profile in mig)


class DemandClass(CalqueModel):
    """One class as the broker counts its demand."""

    offers: list[Annotated[StrictStr, Field(min_length=1, max_length=64)]] = Field(
        min_length=1, description="what each host of the class offers: MIG profiles of its layout, or 'mps'"
    )
    reservable: dict[Annotated[StrictStr, Field(min_length=1, max_length=64)], Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict,
        description="slices of each profile the class's hosts hold at its maximum size: what a reservation may "
        "count on beyond the fixed hosts (calque session reserve)",
    )
    per_host: dict[Annotated[StrictStr, Field(min_length=1, max_length=64)], Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict,
        description="slices of each profile one host of the class holds: with it, the broker raises the class's "
        "desired capacity ahead of a reservation of that profile (reservation_lead) and lowers it after",
    )
    boot_s: Seconds = Field(
        420.0, gt=0, le=3600, description="a host's boot until its slices are offered (the class's measured boot)"
    )


class DemandSettings(CalqueModel):
    """``broker.yaml``'s ``fleet``: the demand the broker publishes, per class, and where."""

    classes: dict[ClassName, DemandClass] = Field(min_length=1)
    wait_s: Seconds = Field(120.0, gt=0, description="a request waiting longer than this counts as demand")
    publish_every: Seconds = Field(60.0, ge=5, description="seconds between publications (CloudWatch's period)")
    region: str = Field(description="the AWS region of the classes' groups and metric")
    endpoint_url: str | None = Field(None, description="an AWS endpoint (moto in tests and the sandbox)")
    discover: bool = Field(True, description="reach the hosts the classes register under /calque/session-fleet")


class HostRegistration(CalqueModel):
    """What one booted host of a class registers: how the broker reaches its daemon over TCP."""

    name: Annotated[StrictStr, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    address: BindAddress
    port: int = Field(7461, ge=1, le=65535)
    offers: list[Annotated[StrictStr, Field(min_length=1, max_length=64)]] = Field(default_factory=list)
    fleet_class: ClassName
    instance_id: Annotated[StrictStr, Field(pattern=r"^i-[0-9a-f]{8,17}$")]


class MungeKeySource(CalqueModel):
    """Where the institution's munge key lives for a class: one of an SSM SecureString or an S3 object."""

    ssm_parameter: str | None = Field(None, pattern=r"^/[A-Za-z0-9_.\-/]+$", description="a SecureString's name")
    s3_bucket: str | None = None
    s3_key: str | None = None
    kms_key_arn: str | None = Field(None, description="the KMS key that encrypts it, when not AWS's own")

    @model_validator(mode="after")
    def _one(self) -> MungeKeySource:
        s3 = self.s3_bucket is not None or self.s3_key is not None
        if (self.ssm_parameter is None) == (not s3) or (s3 and not (self.s3_bucket and self.s3_key)):
            raise ValueError("give the munge key as ssm_parameter, or as s3_bucket and s3_key: exactly one place")
        return self


class SessionHostSpec(CalqueModel):
    """What a class's user-data carries: everything a booting host needs to become a session host."""

    fleet_class: ClassName
    region: str
    endpoint_url: str | None = Field(None, description="an AWS endpoint (moto in tests and the sandbox)")
    imds_endpoint: str = IMDS_ENDPOINT
    session_config: dict[str, Any] = Field(default_factory=dict, description="the class's session.yaml")
    institution: dict[str, Any] = Field(description="institution.yaml: the broker and the labs (hosts: none)")
    mig_configs: dict[str, Any] = Field(default_factory=dict, description="named MIG configs (calque's layout format)")
    mig_config: str = Field("", description="the layout the class's hosts get at boot; empty: none")
    offers: list[Annotated[StrictStr, Field(min_length=1, max_length=64)]] = Field(min_length=1)
    port: int = Field(7461, ge=1, le=65535, description="the session daemon's TCP port")
    munge_key: MungeKeySource
    protect_every: Seconds = Field(15.0, ge=1, le=300, description="seconds between the fleet helper's looks")
    drain_hold: Seconds = Field(7200.0, ge=30, le=7200, description="longest wait for sessions on the way out")

    @model_validator(mode="after")
    def _layout_named(self) -> SessionHostSpec:
        if self.mig_config and self.mig_config not in self.mig_configs and self.mig_config != "all-disabled":
            raise ValueError(f"mig_config {self.mig_config!r} is not among mig_configs ({', '.join(self.mig_configs)})")
        return self
