"""Pydantic v2 models shared by every layer, defined once.

One module per contract family; import from here (``from calque.models import ClaimRef``) so that
nothing re-declares a model. Every model forbids unknown fields; those that cross a process or
network boundary carry a ``version``.

The families load on first use (PEP 562 ``__getattr__``): a researcher's ``calque session status``
imports the session models only, not the pool and acquire families with their many validators.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from calque.lazyload import lazy_names

if TYPE_CHECKING:  # the same names, eagerly, for type checkers
    from calque.models.acquire import (
        CohortInstance,
        CohortPlan,
        CohortResult,
        CohortSpec,
        InstanceRate,
        LaunchAttempt,
        RampReport,
        RampRung,
        RatesTable,
        RootVolume,
        SpendArithmetic,
    )
    from calque.models.base import CalqueModel
    from calque.models.gpu import (
        ComputeInstance,
        DeviceSample,
        GpuDevice,
        GpuInstance,
        GpuProcess,
        MigDevice,
    )
    from calque.models.pool import (
        SCHEMA_VERSION,
        ClaimCost,
        ClaimRef,
        Item,
        ItemError,
        ItemResult,
        Manifest,
        PoolSpec,
        QueueDepth,
        QueueSettings,
        RunRecord,
        RunReport,
        Summary,
    )
    from calque.models.poolcrash import CrashMark
    from calque.models.poolload import LoadRecord, PoolStatus
    from calque.models.session import (
        Session,
        SessionRequest,
        SessionResponse,
        Slice,
        SliceState,
        UsageReport,
        UsageRow,
    )
    from calque.models.versions import SESSION_PROTOCOL_VERSION

_FAMILY = {
    "CohortInstance": "calque.models.acquire",
    "CohortPlan": "calque.models.acquire",
    "CohortResult": "calque.models.acquire",
    "CohortSpec": "calque.models.acquire",
    "InstanceRate": "calque.models.acquire",
    "LaunchAttempt": "calque.models.acquire",
    "RampReport": "calque.models.acquire",
    "RampRung": "calque.models.acquire",
    "RatesTable": "calque.models.acquire",
    "RootVolume": "calque.models.acquire",
    "SpendArithmetic": "calque.models.acquire",
    "CalqueModel": "calque.models.base",
    "ComputeInstance": "calque.models.gpu",
    "DeviceSample": "calque.models.gpu",
    "GpuDevice": "calque.models.gpu",
    "GpuInstance": "calque.models.gpu",
    "GpuProcess": "calque.models.gpu",
    "MigDevice": "calque.models.gpu",
    "SCHEMA_VERSION": "calque.models.pool",
    "ClaimCost": "calque.models.pool",
    "ClaimRef": "calque.models.pool",
    "Item": "calque.models.pool",
    "ItemError": "calque.models.pool",
    "ItemResult": "calque.models.pool",
    "Manifest": "calque.models.pool",
    "PoolSpec": "calque.models.pool",
    "QueueDepth": "calque.models.pool",
    "QueueSettings": "calque.models.pool",
    "RunRecord": "calque.models.pool",
    "RunReport": "calque.models.pool",
    "Summary": "calque.models.pool",
    "CrashMark": "calque.models.poolcrash",
    "LoadRecord": "calque.models.poolload",
    "PoolStatus": "calque.models.poolload",
    "SESSION_PROTOCOL_VERSION": "calque.models.versions",
    "Session": "calque.models.session",
    "SessionRequest": "calque.models.session",
    "SessionResponse": "calque.models.session",
    "Slice": "calque.models.session",
    "SliceState": "calque.models.session",
    "UsageReport": "calque.models.session",
    "UsageRow": "calque.models.session",
}


__getattr__ = lazy_names(__name__, _FAMILY, globals())


__all__ = [
    "SCHEMA_VERSION",
    "SESSION_PROTOCOL_VERSION",
    "CalqueModel",
    "ClaimCost",
    "ClaimRef",
    "CohortInstance",
    "CohortPlan",
    "CohortResult",
    "CohortSpec",
    "ComputeInstance",
    "CrashMark",
    "DeviceSample",
    "GpuDevice",
    "GpuInstance",
    "GpuProcess",
    "InstanceRate",
    "Item",
    "ItemError",
    "ItemResult",
    "LaunchAttempt",
    "LoadRecord",
    "Manifest",
    "MigDevice",
    "PoolSpec",
    "PoolStatus",
    "QueueDepth",
    "QueueSettings",
    "RampReport",
    "RampRung",
    "RatesTable",
    "RootVolume",
    "RunRecord",
    "RunReport",
    "Session",
    "SessionRequest",
    "SessionResponse",
    "Slice",
    "SliceState",
    "SpendArithmetic",
    "Summary",
    "UsageReport",
    "UsageRow",
]
