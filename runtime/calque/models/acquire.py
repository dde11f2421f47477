"""Contracts of acquisition (Layer 0): EC2 rates, what a cohort asks for, what it got.

A cohort is N EC2 instances tagged ``calque:cohort=<name>``; ``CohortSpec`` is what the caller asks
for, ``CohortState`` is what exists (and what a plan or an apply changed). Rates come from the
package data file ``data/ec2-rates.yaml`` through ``calque.aws.pricing``.
"""

from __future__ import annotations

from pydantic import Field

from calque.models.base import CalqueModel


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


class RatesTable(CalqueModel):
    """The whole rates file: one region's on-demand prices per instance type."""

    version: int = 1
    region: str
    currency: str = "USD"
    sources: dict[str, str] = Field(default_factory=dict)
    types: dict[str, InstanceRate]
