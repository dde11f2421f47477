"""Pydantic v2 models shared by every layer, defined once.

One module per contract family; import from here (``from calque.models import ClaimRef``) so that
nothing re-declares a model. Every model forbids unknown fields; those that cross a process or
network boundary carry a ``version``.
"""

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
from calque.models.gpu import ComputeInstance, GpuDevice, GpuInstance, GpuProcess, MigDevice
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
from calque.models.session import (
    SESSION_PROTOCOL_VERSION,
    Session,
    SessionRequest,
    SessionResponse,
    Slice,
    SliceState,
    UsageReport,
    UsageRow,
)

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
    "GpuDevice",
    "GpuInstance",
    "GpuProcess",
    "InstanceRate",
    "Item",
    "ItemError",
    "ItemResult",
    "LaunchAttempt",
    "Manifest",
    "MigDevice",
    "PoolSpec",
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
