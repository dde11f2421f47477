"""Quota preflight: does the account's running vCPU quota leave room for the cohort?

EC2 limits running instances by vCPUs per quota class (G and VT, P, standard ...) and market. The
quota is read from Service Quotas; usage is the vCPUs of the account's pending and running
instances of that class. Where Service Quotas cannot be read (no permission, an endpoint without
it) the preflight warns and lets EC2 itself refuse, which the sweep handles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from calque.aws import pricing
from calque.aws.aws_errors import describe
from calque.errors import InfrastructureError
from calque.models.acquire import Lifecycle

# Service Quotas codes (service code "ec2") of the running-vCPU quotas, per class and market.
QUOTA_CODES: dict[tuple[str, Lifecycle], tuple[str, str]] = {
    ("G and VT", "on-demand"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("P", "on-demand"): ("L-417A185B", "Running On-Demand P instances"),
    ("Standard", "on-demand"): ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    ("G and VT", "spot"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("P", "spot"): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("Standard", "spot"): ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
}
_STANDARD = ("a", "c", "d", "h", "i", "m", "r", "t", "z")


def quota_class(instance_type: str) -> str | None:
    """The vCPU quota class of ``instance_type``: 'G and VT', 'P', 'Standard', or None (others)."""
    fam = pricing.family(instance_type)
    if fam.startswith(("g", "vt")):
        return "G and VT"
    if fam.startswith("p"):
        return "P"
    if fam[:1] in _STANDARD and not fam.startswith(("dl", "inf", "trn", "hpc")):
        return "Standard"
    return None


@dataclass
class QuotaCheck:
    """Headroom per (class, market) and what the preflight decided."""

    warnings: list[str] = field(default_factory=list)
    blocked_types: set[tuple[Lifecycle, str]] = field(default_factory=set)
    room: dict[tuple[str, Lifecycle], int] = field(default_factory=dict)  # vCPUs free


def _vcpus_of(ec2: Any, instance_type: str, cache: dict[str, int]) -> int:
    if instance_type not in cache:
        try:
            cache[instance_type] = pricing.vcpus(instance_type)
        except Exception:  # not in the rates table (a non-GPU type): ask EC2
            try:
                info = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
                cache[instance_type] = int(info[0]["VCpuInfo"]["DefaultVCpus"]) if info else 0
            except (ClientError, BotoCoreError, KeyError, IndexError):
                cache[instance_type] = 0
    return cache[instance_type]


def _usage(ec2: Any, keys: set[tuple[str, Lifecycle]]) -> dict[tuple[str, Lifecycle], int]:
    """vCPUs of the account's pending and running instances per (class, market)."""
    used = {k: 0 for k in keys}
    cache: dict[str, int] = {}
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    )
    for page in pages:
        for res in page.get("Reservations", []):
            for inst in res.get("Instances", []):
                cls = quota_class(inst["InstanceType"])
                market: Lifecycle = "spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand"
                if cls is not None and (cls, market) in used:
                    used[(cls, market)] += _vcpus_of(ec2, inst["InstanceType"], cache)
    return used


def preflight(
    ec2: Any,
    quotas: Any,
    *,
    markets: Sequence[Lifecycle],
    instance_types: Sequence[str],
    need: int,
    viable_need: int,
) -> QuotaCheck:
    """Check the vCPU quotas for launching ``need`` more instances (at least ``viable_need``).

    Types whose class has no room for even one instance are blocked (with a warning); if the quotas
    cannot fit ``viable_need`` instances at all, raise InfrastructureError naming the quota to raise.
    """
    check = QuotaCheck()
    keys = {(c, m) for m in markets for t in instance_types if (c := quota_class(t)) is not None}
    limits: dict[tuple[str, Lifecycle], float] = {}
    for key in sorted(keys):
        code, title = QUOTA_CODES[key]
        try:
            limits[key] = float(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
        except (ClientError, BotoCoreError) as exc:
            check.warnings.append(
                f"could not read the EC2 quota {title!r} ({code}) from Service Quotas ({describe(exc)}); "
                "continuing without a quota check (EC2 will refuse launches over it)"
            )
    if not limits:
        return check
    used = _usage(ec2, set(limits))
    fit = 0
    for key, limit in limits.items():
        free = max(0, int(limit) - used[key])
        check.room[key] = free
        cls, market = key
        types = [t for t in instance_types if quota_class(t) == cls]
        smallest = min(pricing.vcpus(t) for t in types)
        for t in types:
            if pricing.vcpus(t) > free:
                check.blocked_types.add((market, t))
                check.warnings.append(
                    f"quota {QUOTA_CODES[key][1]!r} has {free} vCPUs free of {int(limit)}; "
                    f"{t} needs {pricing.vcpus(t)}: skipping {t} ({market})"
                )
        fit += free // smallest
    unchecked = any((quota_class(t), m) not in limits for m in markets for t in instance_types)
    if fit < viable_need and not unchecked:
        detail = "; ".join(
            f"{QUOTA_CODES[k][1]} ({QUOTA_CODES[k][0]}): {int(limits[k])} vCPUs, {used[k]} in use"
            for k in sorted(limits)
        )
        raise InfrastructureError(
            f"EC2 vCPU quota too small: the cohort needs {viable_need} more instance(s) but the quotas fit {fit} "
            f"[{detail}]. Request an increase in Service Quotas (aws service-quotas request-service-quota-increase "
            "--service-code ec2 --quota-code <code> --desired-value <vCPUs>) or lower count/min_viable."
        )
    if fit < need:
        check.warnings.append(f"the vCPU quotas fit {fit} of the {need} instance(s) to launch")
    return check
