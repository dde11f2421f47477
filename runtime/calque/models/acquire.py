"""Contracts of acquisition (Layer 0): EC2 rates, what a cohort asks for, what it got.

A cohort is N EC2 instances tagged ``calque:cohort=<name>``; ``CohortSpec`` is what the caller asks
for, ``CohortState`` is what exists (and what a plan or an apply changed). Rates come from the
package data file ``data/ec2-rates.yaml`` through ``calque.aws.pricing``.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from calque.models.base import CalqueModel, VersionedModel, WholeSeconds
from calque.models.pool import SCHEMA_VERSION


class InstanceRate(CalqueModel):
    """One EC2 instance type's on-demand price and shape, from the rates table."""

    instance_type: str
    usd_per_hour: float = Field(ge=0, description="on-demand Linux list price, $/hour")
    vcpus: int = Field(ge=1)
    gpus: int = Field(ge=0)
    gpu: str = Field(description="GPU model and memory, e.g. L4-24GB")
    source: str = Field(description="where the figure came from (a URL or a source key's text)")
    as_of: str = Field(description="date the figure was taken (YYYY-MM-DD)")
    uncertain: str | None = Field(None, description="why this row may be wrong; None when confirmed")


class RatesTable(VersionedModel):
    """The whole rates file: one region's on-demand prices per instance type."""

    upgrade_hint: ClassVar[str] = "upgrade calque, or write the rates file for the version it reads"
    version_label: ClassVar[str] = "rates table"
    version: int = 1
    region: str
    currency: str = "USD"
    sources: dict[str, str] = Field(default_factory=dict)
    types: dict[str, InstanceRate]


# --- cohorts ------------------------------------------------------------------------------------

Market = Literal["on-demand", "spot", "spot-then-on-demand"]
Lifecycle = Literal["on-demand", "spot"]
VolumeType = Literal["gp3", "gp2", "io1", "io2"]

COHORT_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
MAX_TTL_S = 14 * 86400


class RootVolume(CalqueModel):
    """The instance's root EBS volume: always encrypted, deleted with the instance."""

    size_gib: int = Field(100, ge=8, le=16384, description="size in GiB (8..16384)")
    type: VolumeType = "gp3"
    kms_key_id: str | None = Field(None, description="KMS key for encryption; None uses the account's EBS default key")


class LaunchOptions(CalqueModel):
    """What an instance is launched from, declared once for ``calque.gpu.pool_group`` and
    ``calque.gpu.ec2_cohort``: their requests extend it, as their argument specs take
    ``module_utils/_launch.py`` and their docs the ``launch`` fragment."""

    ami: str | None = None
    ami_ssm_parameter: str | None = None
    root_volume: RootVolume = Field(default_factory=RootVolume)
    instance_profile: str | None = None
    security_groups: list[str] = Field(default_factory=list)
    key_name: str | None = None


class CohortSpec(VersionedModel):
    """What a caller asks the Acquirer for: a named cohort of ``count`` instances."""

    upgrade_hint: ClassVar[str] = "upgrade calque where the cohort is applied, or write the spec's older version"
    version_label: ClassVar[str] = "cohort spec"
    version: int = SCHEMA_VERSION
    name: str = Field(pattern=COHORT_NAME_RE, description="cohort name, the value of the calque:cohort tag")
    count: int = Field(ge=0, le=1000, description="instances the cohort should have")
    min_viable: int | None = Field(None, ge=0, description="fewest instances that count as success (default: count)")
    instance_types: list[str] = Field(description="instance types in order of preference (at least one)")
    subnets: list[str] = Field(default_factory=list, description="subnet ids (one per AZ) in order of preference")
    market: Market = "on-demand"
    spot_max_price: float | None = Field(None, gt=0, description="$/hour cap for spot; None caps at on-demand")
    ami: str | None = Field(None, description="AMI id; or use ami_ssm_parameter")
    ami_ssm_parameter: str | None = Field(None, description="SSM parameter naming the AMI id")
    root_volume: RootVolume = Field(default_factory=RootVolume)
    instance_profile: str | None = Field(None, description="IAM instance profile name or ARN")
    security_groups: list[str] = Field(default_factory=list, description="security group ids")
    key_name: str | None = None
    user_data: str | None = Field(None, description="extra user-data, run after calque's TTL part")
    ttl_seconds: WholeSeconds = Field(
        3 * 3600, ge=60, le=MAX_TTL_S, description="hard lifetime; the instance powers off"
    )
    tags: dict[str, str] = Field(default_factory=dict)
    pool: str | None = Field(None, description="value of the calque:pool tag")
    owner: str | None = Field(None, description="value of the calque:owner tag (default: the local user)")
    max_hourly_usd: float | None = Field(None, ge=0, description="refuse a cohort dearer than this per hour")
    cleanup_on_failure: bool = Field(True, description="terminate what this attempt launched when it fails")
    wait: bool = True
    wait_timeout_s: int = Field(600, ge=1, le=3600)

    @field_validator("instance_types")
    @classmethod
    def _types(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("instance_types is empty: list at least one EC2 instance type, most preferred first")
        if len(set(v)) != len(v):
            raise ValueError("instance_types lists a type twice; list each once, in order of preference")
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in v if k.startswith("calque:"))
        if reserved:
            raise ValueError(f"tags {reserved} use the reserved calque: prefix; calque sets those itself")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> CohortSpec:
        if self.min_viable is not None and self.min_viable > self.count:
            raise ValueError(
                f"min_viable ({self.min_viable}) is more than count ({self.count}); set min_viable <= count"
            )
        if self.ami and self.ami_ssm_parameter:
            raise ValueError("give ami or ami_ssm_parameter, not both")
        if self.market == "on-demand" and self.spot_max_price is not None:
            raise ValueError("spot_max_price applies to spot markets only; remove it or set market to spot")
        return self

    @property
    def viable(self) -> int:
        return self.count if self.min_viable is None else self.min_viable


class CohortInstance(CalqueModel):
    """One instance of a cohort as EC2 describes it."""

    instance_id: str
    instance_type: str
    availability_zone: str
    subnet_id: str | None = None
    private_ip: str | None = None
    public_ip: str | None = None
    lifecycle: Lifecycle = "on-demand"
    state: str
    launch_time: datetime
    expires_at: datetime | None = None


class LaunchAttempt(CalqueModel):
    """One RunInstances call of a capacity sweep and what came of it."""

    instance_type: str
    subnet_id: str | None
    market: Lifecycle
    requested: int
    launched: int
    error_code: str | None = None
    error: str | None = None


class SpendArithmetic(CalqueModel):
    """How the spend gate priced a cohort (the dearest candidate type, at the on-demand rate)."""

    count: int
    instance_type: str
    usd_per_hour: float
    hourly_usd: float
    max_hourly_usd: float | None = None

    def sentence(self) -> str:
        text = f"{self.count} x {self.instance_type} at ${self.usd_per_hour:.4f}/h = ${self.hourly_usd:.2f}/h"
        if self.max_hourly_usd is not None:
            op = ">" if self.hourly_usd > self.max_hourly_usd + 1e-9 else "<="
            text += f" {op} max_hourly_usd ${self.max_hourly_usd:.2f}/h"
        return text


class CohortPlan(VersionedModel):
    """What acquiring a spec would do, before doing it (Ansible's check mode)."""

    version: int = SCHEMA_VERSION
    name: str
    current: int
    target: int
    launch: int = Field(ge=0, description="instances to launch")
    terminate: list[str] = Field(default_factory=list, description="instance ids to terminate, newest first")
    spend: SpendArithmetic

    @property
    def changes(self) -> bool:
        return self.launch > 0 or bool(self.terminate)


class CohortResult(VersionedModel):
    """What a cohort is after an acquire or a release, and what the call changed."""

    version: int = SCHEMA_VERSION
    name: str
    changed: bool
    instances: list[CohortInstance]
    launched: list[str] = Field(default_factory=list)
    terminated: list[str] = Field(default_factory=list)
    requested: int = 0
    shortfall: int = Field(0, ge=0, description="instances short of the requested count")
    hourly_usd: float = Field(0.0, description="on-demand $/h of the instances now in the cohort")
    attempts: list[LaunchAttempt] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)


# --- ramp ---------------------------------------------------------------------------------------


class RampRung(CalqueModel):
    """One rung of a ramp: N items through the one warm worker."""

    rung: int = Field(ge=0, description="position in the ramp, from 0")
    items: int = Field(ge=0)
    ok: int = Field(ge=0)
    failed: int = Field(ge=0)
    wall_s: float = Field(ge=0)
    items_per_s: float = Field(ge=0)
    enter_seconds_paid: float = Field(ge=0, description="model load paid by this rung: only the first pays")


class RampReport(VersionedModel):
    """What ``calque ramp`` did: the instance it held, each rung, and how it ended."""

    version: int = SCHEMA_VERSION
    workload: str
    method: str | None = None
    cohort: str
    instance: CohortInstance | None = None
    hourly_usd: float = 0.0
    enter_seconds: float = Field(0.0, description="what @enter cost, once")
    enter_count: int = Field(0, description="times @enter ran: 1 across all rungs")
    rungs: list[RampRung] = Field(default_factory=list)
    terminated: list[str] = Field(default_factory=list)
    error: str | None = None
