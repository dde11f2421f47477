"""The spend gate: consent to spend, consent to terminate, and the hourly ceiling with its arithmetic.

A cohort is priced at its target count times the on-demand rate of the dearest type it may launch
(the sweep can end on any candidate, and spot never costs more than on-demand), so the refusal
states the worst case and the arithmetic behind it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from calque.aws import pricing
from calque.errors import RefusedError
from calque.models.acquire import SpendArithmetic

# Each way a person gives the consent: the inventory variable pool.yml and teardown.yml read, the
# module option, the CLI flag (a refusal seen in a play names the variable to set, not only the option).
SPEND_FLAGS = (
    "calque_i_understand_this_spends_money: true (inventory, pool.yml), i_understand_this_spends_money: true"
    " (module) or --i-understand-this-spends-money (CLI)"
)
TERMINATE_FLAGS = (
    "calque_i_understand_this_terminates_instances: true (inventory, pool.yml and teardown.yml),"
    " i_understand_this_terminates_instances: true (module) or --i-understand-this-terminates-instances (CLI)"
)


@dataclass(frozen=True)
class Consent:
    """What the caller explicitly agreed to. Both default to no."""

    spend: bool = False
    terminate: bool = False


def price_cohort(count: int, instance_types: Sequence[str], max_hourly_usd: float | None = None) -> SpendArithmetic:
    """The worst-case hourly cost of ``count`` instances of any of ``instance_types``."""
    rates = [(pricing.hourly_usd(t), t) for t in instance_types]
    usd, dearest = max(rates)
    return SpendArithmetic(
        count=count,
        instance_type=dearest,
        usd_per_hour=usd,
        hourly_usd=round(count * usd, 4),
        max_hourly_usd=max_hourly_usd,
    )


def check_spend_limit(spend: SpendArithmetic) -> None:
    """Refuse a cohort whose worst-case hourly cost is over its ``max_hourly_usd``."""
    if spend.max_hourly_usd is not None and spend.hourly_usd > spend.max_hourly_usd + 1e-9:
        raise RefusedError(
            f"refusing to acquire: {spend.sentence()}. Lower count, list cheaper instance_types, "
            "or raise max_hourly_usd."
        )


def require_spend_consent(consent: Consent, launch: int, spend: SpendArithmetic) -> None:
    if launch > 0 and not consent.spend:
        raise RefusedError(
            f"launching {launch} EC2 instance(s) spends money (cohort up to {spend.sentence()}); "
            f"to proceed pass {SPEND_FLAGS}"
        )


def require_terminate_consent(consent: Consent, instance_ids: Sequence[str]) -> None:
    if instance_ids and not consent.terminate:
        shown = ", ".join(instance_ids[:5]) + (" ..." if len(instance_ids) > 5 else "")
        raise RefusedError(
            f"this would terminate {len(instance_ids)} instance(s) ({shown}); to proceed pass {TERMINATE_FLAGS}"
        )
