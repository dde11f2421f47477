"""What the ``pool_group`` operation (``pool_group.py``) is asked, what it plans and what it reports:
the pool's group as pool.yml names it (checked for consistency before anything is priced), the plan
that check mode shows and the real run carries out, and the group after the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator

from calque.aws.acquire import group as grp
from calque.aws.acquire import template as tpl
from calque.aws.acquire.spend_gate import Consent
from calque.models.acquire import LaunchOptions
from calque.models.base import CalqueModel, PoolName
from calque.models.institution import LabBudget
from calque.models.pool_names import PoolNames
from calque.models.warmth import ScheduleEntry, WarmPoolSettings
from calque.ops.pool_warmth import WarmthPlan, check_warm_request


class PoolGroupRequest(LaunchOptions):
    """A pool's group as pool.yml names it (the module's options)."""

    pool: PoolName
    state: Literal["present", "absent"] = "present"
    count: int | None = Field(None, ge=0, le=1000, description="desired instances; None leaves it to policies")
    min_size: int = Field(0, ge=0, le=1000)
    max_size: int | None = Field(None, ge=0, le=1000, description="default: count")
    instance_types: list[str] | None = None
    subnets: list[str] = Field(default_factory=list)
    market: Literal["spot", "on-demand"] = "spot"
    on_demand_base: int = Field(0, ge=0, le=1000)
    user_data: str | None = None
    ttl: str = "3h"
    tags: dict[str, Any] = Field(default_factory=dict)
    min_healthy_percentage: int = Field(90, ge=0, le=100)
    instance_warmup: int = Field(300, ge=0, le=3600)
    max_hourly_usd: float | None = Field(None, ge=0)
    i_understand_this_spends_money: bool = False
    i_understand_this_terminates_instances: bool = False
    gate_only: bool = False
    wait_timeout: int = Field(600, ge=1, le=3600)
    warm: WarmPoolSettings | None = Field(None, description="an EC2 warm pool of bootstrapped instances")
    capacity_block: str | None = Field(
        None,
        pattern=r"^cr-[0-9a-f]{8,17}$",
        description="an EC2 Capacity Block for ML (its capacity reservation id) the group launches into",
    )
    schedule: list[ScheduleEntry] = Field(default_factory=list, description="windows of a raised minimum")
    lab_budget: LabBudget | None = Field(None, description="the lab's monthly budget (calque_labs): spent, refused")
    lab_spent_elsewhere: float = Field(0.0, ge=0, description="deprecated and ignored: the broker's ledger counts them")
    bucket: str | None = None  # the pool's bucket and prefix: where its instances write usage records
    prefix: str = "calque"

    @model_validator(mode="after")
    def _consistent(self) -> PoolGroupRequest:
        if self.state == "absent":
            return self
        if not self.instance_types:
            raise ValueError("instance_types is empty: list at least one EC2 instance type, most preferred first")
        if self.count is None and self.max_size is None:
            raise ValueError("give count or max_size: the spend gate prices max_size x the dearest type")
        top = self.top
        if self.min_size > top or (self.count is not None and self.count > top):
            raise ValueError(f"min_size and count must be <= max_size ({top}); raise max_size or lower them")
        if self.ami and self.ami_ssm_parameter:
            raise ValueError("give ami or ami_ssm_parameter, not both")
        reserved = sorted(k for k in self.tags if str(k).startswith("calque:"))
        if reserved:
            raise ValueError(f"tags {reserved} use the reserved calque: prefix; calque sets those itself")
        check_warm_request(self.warm, self.market, self.instance_types)
        if self.capacity_block is not None and (
            self.market != "on-demand" or len(self.instance_types) != 1 or self.warm is not None
        ):
            raise ValueError(
                f"capacity_block {self.capacity_block}: a Capacity Block is one instance type bought ahead, so it "
                "needs market: on-demand, exactly one instance type (the block's) and no warm pool"
            )
        return self

    @property
    def top(self) -> int:
        return self.max_size if self.max_size is not None else int(self.count or 0)

    @property
    def priced(self) -> int:
        """The most instances running at once: the group's top plus warmed ones bootstrapping beside it."""
        return self.top + (self.warm.min_size if self.warm else 0)

    def consent(self) -> Consent:
        return Consent(spend=self.i_understand_this_spends_money, terminate=self.i_understand_this_terminates_instances)


class PoolGroupResult(CalqueModel):
    """The group after the run (as it would be, in check mode)."""

    pool: str
    group: str
    template: str
    template_version: int | None = None
    config: str | None = Field(None, description="the config digest new instances are launched with")
    min_size: int = 0
    max_size: int = 0
    desired: int = 0
    instances: list[str] = Field(default_factory=list)
    replaced: list[str] = Field(default_factory=list, description="unhealthy instances replaced")
    rolling: list[str] = Field(default_factory=list, description="instances an instance refresh replaces")
    refresh_id: str | None = None
    spend: str = ""


@dataclass
class PoolGroupPlan:
    request: PoolGroupRequest
    names: PoolNames
    before: grp.GroupState | None
    template: tpl.TemplateState | None
    spend: str = ""
    hourly_usd: float = 0.0
    data: dict[str, Any] | None = None  # the template version to put; None keeps the current one
    digest: str | None = None
    shape: grp.GroupShape | None = None
    desired: int = 0
    update_shape: bool = False
    replace: list[str] = field(default_factory=list)
    roll: list[str] = field(default_factory=list)
    renew_only: bool = False
    actions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    warmth: WarmthPlan | None = None

    @property
    def changes(self) -> bool:
        return bool(self.actions)

    @property
    def launches(self) -> bool:
        before = self.before.desired if self.before else 0
        warms = self.warmth is not None and self.warmth.launches
        grows = self.desired > before or (self.before is None and self.desired > 0)
        return self.request.state == "present" and (grows or warms)

    @property
    def ends(self) -> list[str]:
        """Instances the run terminates by choice (not counting unhealthy ones EC2 would replace anyway)."""
        if self.before is None:
            return []
        if self.request.state == "absent":
            return [i.instance_id for i in self.before.instances]
        fewer = max(0, self.before.desired - self.desired)
        newest = [i.instance_id for i in self.before.instances][-fewer:] if fewer else []
        return newest + [i for i in self.roll if i not in newest]
