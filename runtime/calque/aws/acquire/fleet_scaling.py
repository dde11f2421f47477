"""How a class of session hosts follows the broker's queue: out on unserved demand, in on idle hosts.

The broker (``calque.session.broker.demand``) publishes two metrics per class in ``calque/session``,
dimension ``Class``: ``UnservedRequests`` (requests waiting longer than its ``wait_s`` that no running
host of the class can serve; published only while there are some) and ``IdleHosts`` (the class's
reachable hosts with no live session; published every period). The parts, named from the class's pool
``fleet/<class>`` and read, compared and written by ``PoolScaling`` as a pool's are:

- a step policy ``<base>-demand`` on alarm ``<base>-demand`` (``UnservedRequests`` >= 1 in a minute):
  one host more per ``slices_per_host`` unserved requests, up to ``max_step`` hosts in one step (the
  group's max caps it); ``EstimatedInstanceWarmup`` is the host's boot, so a host still booting is
  counted before another is added for the same requests;
- a step policy ``<base>-idle`` (one host fewer) on alarm ``<base>-idle``: at least one idle host in
  every minute of ``idle_s``. Missing data is not breaching: a silent broker never shrinks a class.
  Scale-in picks only unprotected instances, and a host with a live session is protected
  (``calque.session.fleet.protect``), so the host that goes is an idle one;
- the termination lifecycle hook ``calque-drain``: a host leaving the group (scale-in, teardown, a
  refresh) is held in ``Terminating:Wait`` while it drains (``calque session drain``), up to
  ``drain_timeout_s``, and completes the action itself once its last session ended.

Scheduled capacity (``calque_session_fleet_schedule``) is the group's scheduled actions, made by
``pool_group`` as a pool's windows of warmth are (``calque.aws.acquire.schedule``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from calque.aws.acquire.scaling import ScalingState, drain_hooks
from calque.models.base import CalqueModel
from calque.models.fleet import CLASS_DIMENSION, DEMAND_METRIC, DEMAND_NAMESPACE
from calque.models.pool_names import PoolNames

IDLE_METRIC = "IdleHosts"
PERIOD_S = 60


class FleetScalingSettings(CalqueModel):
    """A class's scaling: its hosts' capacity and boot, how long idle before a host goes, the drain bound."""

    slices_per_host: int = Field(ge=1, le=64, description="slices one host of the class offers (its MIG layout)")
    boot_s: int = Field(420, ge=60, le=3600, description="a host's boot to registered (EstimatedInstanceWarmup)")
    idle_s: int = Field(1200, ge=60, le=86400, description="a host idle this long may go")
    drain_timeout_s: int = Field(7200, ge=30, le=7200, description="the lifecycle hook's hold while a host drains")
    max_step: int = Field(10, ge=1, le=100, description="the most hosts one scale-out step adds")

    @property
    def idle_periods(self) -> int:
        return -(-self.idle_s // PERIOD_S)

    def steps(self) -> list[dict[str, Any]]:
        """Step adjustments relative to the alarm's threshold (1 unserved request): k hosts for up to
        k x slices_per_host unserved requests, ``max_step`` beyond."""
        out: list[dict[str, Any]] = []
        for k in range(1, self.max_step + 1):
            step: dict[str, Any] = {"MetricIntervalLowerBound": float((k - 1) * self.slices_per_host)}
            if k < self.max_step:
                step["MetricIntervalUpperBound"] = float(k * self.slices_per_host)
            step["ScalingAdjustment"] = k
            out.append(step)
        return out

    def hosts_for(self, unserved: int) -> int:
        """The hosts one step adds for ``unserved`` requests (what AWS does with ``steps()``): the bench's model."""
        if unserved < 1:
            return 0
        return min(self.max_step, -(-unserved // self.slices_per_host))


def policy_names(names: PoolNames) -> tuple[str, str]:
    """(demand, idle): policy and alarm names carry the class's base."""
    return f"{names.base}-demand", f"{names.base}-idle"


def _metric(name: str, fleet_class: str, stat: str) -> dict[str, Any]:
    return {
        "Namespace": DEMAND_NAMESPACE,
        "MetricName": name,
        "Dimensions": [{"Name": CLASS_DIMENSION, "Value": fleet_class}],
        "Statistic": stat,
        "Period": PERIOD_S,
    }


def desired_fleet_scaling(names: PoolNames, fleet_class: str, s: FleetScalingSettings) -> ScalingState:
    """Every scaling part class ``fleet_class`` (whose pool names are ``names``) should have under ``s``."""
    demand, idle = policy_names(names)
    step = {"PolicyType": "StepScaling", "AdjustmentType": "ChangeInCapacity", "MetricAggregationType": "Maximum"}
    policies = {
        demand: {**step, "EstimatedInstanceWarmup": s.boot_s, "StepAdjustments": s.steps()},
        idle: {
            **step,
            "MetricAggregationType": "Minimum",
            "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": -1}],
        },
    }
    alarm = {"ActionsEnabled": True}
    alarms = {
        demand: {
            **alarm,
            "AlarmDescription": f"calque session class {fleet_class}: requests wait that no running host can serve",
            **_metric(DEMAND_METRIC, fleet_class, "Maximum"),
            "EvaluationPeriods": 1,
            "DatapointsToAlarm": 1,
            "ComparisonOperator": "GreaterThanOrEqualToThreshold",
            "Threshold": 1.0,
            "TreatMissingData": "notBreaching",  # published only while requests wait unserved
            "AlarmActions": [demand],
        },
        idle: {
            **alarm,
            "AlarmDescription": f"calque session class {fleet_class}: a host had no live session for {s.idle_s}s",
            **_metric(IDLE_METRIC, fleet_class, "Minimum"),
            "EvaluationPeriods": s.idle_periods,
            "DatapointsToAlarm": s.idle_periods,
            "ComparisonOperator": "GreaterThanOrEqualToThreshold",
            "Threshold": 1.0,
            "TreatMissingData": "notBreaching",  # a silent broker never shrinks a class
            "AlarmActions": [idle],
        },
    }
    hooks = drain_hooks(s.drain_timeout_s)
    return ScalingState(group_exists=True, policies=policies, alarms=alarms, hooks=hooks, metrics=[])
