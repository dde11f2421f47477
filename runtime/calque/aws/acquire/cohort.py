"""Reading and ending a cohort: the instances tagged ``calque:cohort=<name>``, and nothing else.

Termination is tag-scoped twice over: instances are found by the cohort tag filter, and each one's
tags are checked again before its id is passed to TerminateInstances.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from botocore.exceptions import WaiterError

from calque.aws.acquire.launch_spec import TAG_COHORT, TAG_EXPIRES
from calque.aws.aws_errors import aws_errors
from calque.errors import InfrastructureError
from calque.models.acquire import CohortInstance

LIVE_STATES = ("pending", "running", "stopping", "stopped")


def tags_of(inst: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


def to_instance(inst: dict[str, Any]) -> CohortInstance:
    expires = tags_of(inst).get(TAG_EXPIRES)
    return CohortInstance(
        instance_id=inst["InstanceId"],
        instance_type=inst["InstanceType"],
        availability_zone=inst.get("Placement", {}).get("AvailabilityZone", ""),
        subnet_id=inst.get("SubnetId"),
        private_ip=inst.get("PrivateIpAddress"),
        public_ip=inst.get("PublicIpAddress"),
        lifecycle="spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand",
        state=inst.get("State", {}).get("Name", "unknown"),
        launch_time=inst["LaunchTime"],
        expires_at=datetime.fromisoformat(expires.replace("Z", "+00:00")) if expires else None,
    )


def describe_cohort(ec2: Any, name: str, states: Sequence[str] = LIVE_STATES) -> list[dict[str, Any]]:
    """The raw EC2 descriptions of the cohort's instances in ``states``, oldest first."""
    found: list[dict[str, Any]] = []
    with aws_errors(f"describe the instances of cohort {name!r}"):
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": f"tag:{TAG_COHORT}", "Values": [name]},
                {"Name": "instance-state-name", "Values": list(states)},
            ]
        )
        for page in pages:
            for res in page.get("Reservations", []):
                found.extend(i for i in res.get("Instances", []) if tags_of(i).get(TAG_COHORT) == name)
    return sorted(found, key=lambda i: (i["LaunchTime"], i["InstanceId"]))


def newest_first(instances: Sequence[dict[str, Any]], n: int) -> list[str]:
    """The ids of the ``n`` most recently launched instances (scale down ends these first)."""
    ordered = sorted(instances, key=lambda i: (i["LaunchTime"], i["InstanceId"]), reverse=True)
    return [i["InstanceId"] for i in ordered[: max(0, n)]]


def terminate(ec2: Any, name: str, instance_ids: Sequence[str]) -> list[str]:
    """Terminate ``instance_ids``, only those that really carry this cohort's tag."""
    if not instance_ids:
        return []
    mine = {i["InstanceId"] for i in describe_cohort(ec2, name, (*LIVE_STATES, "shutting-down"))}
    ids = [i for i in instance_ids if i in mine]
    for start in range(0, len(ids), 500):
        with aws_errors(f"terminate instances of cohort {name!r}"):
            ec2.terminate_instances(InstanceIds=ids[start : start + 500])
    return ids


def wait_for(ec2: Any, waiter_name: str, instance_ids: Sequence[str], timeout_s: int, delay_s: int = 5) -> None:
    """A botocore waiter bounded to ``timeout_s`` seconds; InfrastructureError when it gives up."""
    if not instance_ids:
        return
    delay = max(1, min(delay_s, timeout_s))
    attempts = max(1, math.ceil(timeout_s / delay))
    try:
        ec2.get_waiter(waiter_name).wait(
            InstanceIds=list(instance_ids), WaiterConfig={"Delay": delay, "MaxAttempts": attempts}
        )
    except WaiterError as exc:
        raise InfrastructureError(
            f"instances {', '.join(instance_ids)} did not reach {waiter_name.removeprefix('instance_')} "
            f"within {timeout_s}s ({exc.last_response.get('Error', {}).get('Message', exc)})"
        ) from exc
