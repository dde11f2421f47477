"""Contracts of a pool's warmth from zero: its EC2 warm pool, its scheduled warmth, Modal's own knobs.

``WarmPoolSettings`` is ``calque_pool_warm`` (an EC2 Auto Scaling warm pool of instances that ran
the bootstrap up to "ready", then stopped); ``ScheduleEntry`` is one ``calque_pool_schedule`` entry
(a recurring window with a raised minimum); ``ModalKnobs`` is what a script's ``@app.cls`` /
``@app.function`` say about scaling, and ``ScalingDefaults`` the values pool.yml uses with where
each came from (the script, inventory, or calque's default).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from calque.durations import parse_seconds
from calque.models.base import CalqueModel, VersionedModel, WholeSeconds

WarmState = Literal["Stopped", "Hibernated", "Running"]


class WarmPoolSettings(CalqueModel):
    """A pool's EC2 warm pool: how many pre-initialised instances wait, and in which state."""

    state: WarmState = Field("Stopped", description="what a warmed instance waits as: Stopped, Hibernated, Running")
    min_size: int = Field(1, ge=0, le=1000, description="instances kept warmed, whatever the group's size")
    max_prepared: int | None = Field(
        None, ge=0, le=1000, description="most instances warmed or in service together; None: the group's max_size"
    )
    reuse_on_scale_in: bool = Field(True, description="scale-in returns instances to the warm pool (ReuseOnScaleIn)")
    ready_timeout: WholeSeconds = Field(
        1800,
        ge=30,
        le=7200,
        description="the launching hook's wait for the bootstrap to reach ready; then the instance is abandoned",
    )


class ScheduleEntry(CalqueModel):
    """A recurring window of warmth: ``instances`` in service from ``lead`` before ``at`` for ``duration``."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", description="names the two scheduled actions")
    at: str = Field(description="cron 'minute hour day month weekday' of the window's start, e.g. '0 10 * * 1-5'")
    duration: str = Field(description="how long the window lasts (2h, 90m)")
    instances: int = Field(1, ge=0, le=1000, description="the group's minimum during the window")
    lead: str = Field("10m", description="how early the instances are asked for (a class at 10:00 gets them at 09:50)")
    timezone: str = Field("UTC", description="the cron's time zone (IANA, e.g. Europe/London)")

    @model_validator(mode="after")
    def _checked(self) -> ScheduleEntry:
        if len(self.at.split()) != 5:
            raise ValueError(f"at {self.at!r} is not a 5-field cron ('minute hour day month weekday')")
        if not 60 <= self.duration_s <= 86400:
            raise ValueError(f"duration {self.duration!r}: give 1m..24h (a window starts and ends each day)")
        if not 0 <= self.lead_s <= 3600:
            raise ValueError(f"lead {self.lead!r}: give 0..1h")
        return self

    @property
    def duration_s(self) -> int:
        return round(parse_seconds(self.duration, what="duration"))

    @property
    def lead_s(self) -> int:
        return round(parse_seconds(self.lead, what="lead"))


class ModalKnobs(CalqueModel):
    """What a script's decorator says about scaling, in Modal's current names (older names mapped)."""

    target: str = Field(description="the class or function the knobs were read from")
    min_containers: int | None = Field(None, ge=0)
    max_containers: int | None = Field(None, ge=0)
    buffer_containers: int | None = Field(None, ge=0)
    scaledown_window: int | None = Field(None, ge=0, description="seconds idle before a container is stopped")
    notes: list[str] = Field(default_factory=list, description="older names mapped, values that could not be read")


class ScalingValue(CalqueModel):
    value: int | None
    source: str = Field(description="where the value came from: inventory, the script's keyword, or calque's default")


class ScalingDefaults(CalqueModel):
    """The group's and the scaling's values, each with where it came from (pool.yml's --diff shows them)."""

    min_size: ScalingValue
    max_size: ScalingValue
    buffer: ScalingValue
    idle_s: ScalingValue
    workers: int = Field(1, description="worker processes per instance: each serves one container's worth")


class ReadyMark(VersionedModel):
    """What the bootstrap left on an instance once it reached "ready" (the worker reads it at start)."""

    upgrade_hint: ClassVar[str] = "re-run the bootstrap with this calque (delete the mark), or upgrade calque"
    version_label: ClassVar[str] = "ready mark"
    version: int = 1
    source: str = Field(description="the downloaded script, the URI's target and the parameters, hashed")
    workload_digest: str = Field(description="the loaded workload's digest (the worker compares it)")
    steps: list[str] = Field(default_factory=list, description="the hooks run: @build, @enter(snap=True)")
    seconds: float = Field(ge=0, description="how long the steps took")
    at: datetime


class PrewarmReport(CalqueModel):
    """What ``calque pool prewarm`` scheduled: two one-off actions on the pool's group."""

    pool: str
    group: str
    actions: dict[str, dict[str, Any]] = Field(description="scheduled action name -> MinSize and StartTime")
