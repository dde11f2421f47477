"""Declarative operations, one per resource: a request model, ``plan(request)`` and ``apply(plan) -> Outcome``.

Ansible modules (through the collection's ``module_utils/_ops.py``) and CLI verbs are two renderings
of the same operation, so a rule (the queue's keep-current merge, the MIG reboot rule, the MPS
check-mode prediction) exists once. Operations load on first use: a GPU host never imports boto3.
"""

from __future__ import annotations

import importlib
from typing import Any

from calque.ops.base import Operation

# operation name (the module's name) -> "module:class"
OPERATIONS = {
    "pool_queue": "calque.ops.pool_queue:PoolQueueOp",
    "pool_scaling": "calque.ops.pool_scaling:PoolScalingOp",
    "ec2_cohort": "calque.ops.ec2_cohort:CohortOp",
    "pool_group": "calque.ops.pool_group:PoolGroupOp",
    "pool_knobs": "calque.ops.pool_knobs:PoolKnobsOp",
    "mig": "calque.ops.mig:MigLayoutOp",
    "mps": "calque.ops.mps:MpsDaemonsOp",
    "pool_spec": "calque.ops.pool_spec:PoolSpecOp",
    "pool_iam": "calque.ops.pool_iam:PoolRoleOp",
    "pool_iam_policy": "calque.ops.pool_iam_policy:PoolIamOp",
    "runtime": "calque.ops.runtime:RuntimeOp",
    "session_fleet_iam": "calque.ops.session_fleet_iam:FleetRoleOp",
    "session_fleet_iam_policy": "calque.ops.session_fleet_iam_policy:FleetIamOp",
    "session_fleet_scaling": "calque.ops.session_fleet_scaling:FleetScalingOp",
    "session_fleet_user_data": "calque.ops.session_fleet_user_data:FleetUserDataOp",
    "gpu_info": "calque.ops.gpu_info:GpuFactsOp",
    "preflight": "calque.ops.preflight:PreflightOp",  # the controller's action plugin (plugins/action/)
}


def operation(name: str) -> type[Operation[Any, Any, Any]]:
    """The operation class called ``name`` (imported now)."""
    try:
        module, attr = OPERATIONS[name].split(":")
    except KeyError:
        raise KeyError(f"no calque operation {name!r}; known: {', '.join(sorted(OPERATIONS))}") from None
    op: type[Operation[Any, Any, Any]] = getattr(importlib.import_module(module), attr)
    return op
