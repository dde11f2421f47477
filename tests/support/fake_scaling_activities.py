"""FakeScalingActivities: Auto Scaling's activity history, which moto 5.2 answers with an empty list.

moto launches and terminates a group's instances when its desired capacity changes
(``FakeAutoScalingGroup.set_desired_capacity``) but records no activity. This fake wraps that method:
every instance that appears or disappears across a call becomes an activity shaped as AWS writes
one (``Launching a new EC2 instance: i-...`` / ``Terminating EC2 instance: i-...``, StatusCode
``Successful``, StartTime and EndTime now), and ``DescribeScalingActivities`` returns a group's,
newest first, as AWS does. ``shift`` moves an instance's recorded activities in time, as a test that
needs a history the run itself cannot wait for writes it.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

from moto.autoscaling.models import FakeAutoScalingGroup
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import ActionResult

ACTIVITIES: list[dict[str, Any]] = []
_ORIGINAL = FakeAutoScalingGroup.set_desired_capacity


def _record(group: str, description: str, cause: str) -> None:
    now = datetime.now(timezone.utc)
    ACTIVITIES.append(
        {
            "ActivityId": str(uuid.uuid4()),
            "AutoScalingGroupName": group,
            "Description": description,
            "Cause": cause,
            "StartTime": now,
            "EndTime": now,
            "StatusCode": "Successful",
            "Progress": 100,
        }
    )


def set_desired_capacity(self: Any, new_capacity: int | None) -> None:
    before = {s.instance.id for s in self.instance_states}
    _ORIGINAL(self, new_capacity)
    after = {s.instance.id for s in self.instance_states}
    cause = f"a user request set the desired capacity to {new_capacity}"
    for iid in sorted(after - before):
        _record(self.name, f"Launching a new EC2 instance: {iid}", cause)
    for iid in sorted(before - after):
        _record(self.name, f"Terminating EC2 instance: {iid}", cause)


def describe_scaling_activities(self: Any) -> ActionResult:
    group = self._get_param("AutoScalingGroupName")
    found = [a for a in reversed(ACTIVITIES) if group in (None, a["AutoScalingGroupName"])]
    return ActionResult({"Activities": found})


def shift(instance_id: str, seconds: float) -> None:
    """Move every activity of ``instance_id`` by ``seconds`` (negative: into the past)."""
    for a in ACTIVITIES:
        if a["Description"].endswith(instance_id):
            for k in ("StartTime", "EndTime"):
                a[k] = datetime.fromtimestamp(a[k].timestamp() + seconds, tz=timezone.utc)


def install() -> None:
    FakeAutoScalingGroup.set_desired_capacity = set_desired_capacity  # type: ignore[method-assign]
    AutoScalingResponse.describe_scaling_activities = describe_scaling_activities  # type: ignore[method-assign]


def reset() -> None:
    ACTIVITIES.clear()
