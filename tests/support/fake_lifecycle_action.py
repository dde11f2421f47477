"""FakeLifecycleAction: Auto Scaling's CompleteLifecycleAction, which moto 5.2 lacks, added to the moto server.

moto stores lifecycle hooks and warm pools but makes no warm instances and no lifecycle actions:
nothing ever waits in ``Warmed:Pending:Wait``. This strict fake adds that one state and the one
call that leaves it. A test opens an action (``open_action``: an instance of a group waiting on a
hook, as AWS does when it launches an instance into the warm pool or moves one into service); then
``CompleteLifecycleAction`` over HTTP, from any client of the test's moto server, validates as AWS
documents (the group exists; the hook exists on it; LifecycleActionResult is CONTINUE or ABANDON;
an action is open for that instance and hook, else ``ValidationError: No active Lifecycle Action
found with instance ID ...``), records the outcome in ``COMPLETED`` and closes the action.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moto.autoscaling.exceptions import ValidationError
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import EmptyResult


@dataclass(frozen=True)
class Completed:
    group: str
    hook: str
    instance_id: str
    result: str
    token: str | None


_OPEN: set[tuple[str, str, str]] = set()  # (group, hook, instance id) waiting
COMPLETED: list[Completed] = []


def open_action(group: str, hook: str, instance_id: str) -> None:
    """An instance now waits on ``hook`` (AWS's Warmed:Pending:Wait or Pending:Wait)."""
    _OPEN.add((group, hook, instance_id))


def complete_lifecycle_action(self: Any) -> EmptyResult:
    group = self._get_param("AutoScalingGroupName")
    hook = self._get_param("LifecycleHookName")
    instance_id = self._get_param("InstanceId")
    result = self._get_param("LifecycleActionResult")
    backend = self.autoscaling_backend
    if group not in backend.autoscaling_groups:
        raise ValidationError(f"AutoScalingGroup name not found - {group}")
    if not backend.describe_lifecycle_hooks(group, [hook]):
        raise ValidationError(f"No Lifecycle Hook found with name {hook} for group {group} (lifecycle hook not found)")
    if result not in ("CONTINUE", "ABANDON"):
        raise ValidationError(f"Value '{result}' at 'lifecycleActionResult' failed to satisfy constraint")
    if (group, hook, instance_id) not in _OPEN:
        raise ValidationError(f"No active Lifecycle Action found with instance ID {instance_id}")
    _OPEN.discard((group, hook, instance_id))
    COMPLETED.append(Completed(group, hook, instance_id, result, self._get_param("LifecycleActionToken")))
    return EmptyResult()


def install() -> None:
    """Add the call to moto's AutoScaling responder (in this process: start moto after)."""
    AutoScalingResponse.complete_lifecycle_action = complete_lifecycle_action  # type: ignore[attr-defined]


def reset() -> None:
    _OPEN.clear()
    COMPLETED.clear()
