"""FakeInstanceRefresh: EC2 Auto Scaling's instance refresh, which moto 5.2 lacks, added to the moto server.

A strict fake, for exactly three calls (StartInstanceRefresh, DescribeInstanceRefreshes,
CancelInstanceRefresh), installed into moto's AutoScaling responder so that every client of the
test's moto server (pytest, ``ansible-playbook``, the ``calque`` command) reaches it over HTTP.
It validates arguments as AWS documents them (the group must exist; Strategy ``Rolling``;
MinHealthyPercentage 0..100; InstanceWarmup >= 0; one refresh at a time:
``InstanceRefreshInProgress``) and then rolls like AWS does: it replaces the group's instances that
do not match its launch template version, in batches that never take in-service instances below
MinHealthyPercentage of the desired capacity, through moto's own terminate-and-replace. moto
launches replacements at once, so a refresh completes within the call (``Successful``).

"Matching" (SkipMatching) compares what the instance runs with the group's current template
version: its AMI, its user-data and the version's instance tags, because moto does not record
which version launched an instance.
"""

from __future__ import annotations

import base64
import uuid
from datetime import datetime, timezone
from typing import Any

from moto.autoscaling.exceptions import AutoscalingClientError, ValidationError
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import ActionResult
from moto.ec2.responses.launch_templates import LaunchTemplates
from moto.ec2.utils import parse_user_data

_REFRESHES: dict[str, list[dict[str, Any]]] = {}  # group ARN -> refreshes, newest first


class InstanceRefreshInProgress(AutoscalingClientError):
    code = "InstanceRefreshInProgress"


class ActiveInstanceRefreshNotFound(AutoscalingClientError):
    code = "ActiveInstanceRefreshNotFound"


def _text(value: Any) -> str:
    """User-data as text, whether moto holds it base64-encoded, as bytes or as a list of one."""
    if isinstance(value, list):
        value = value[0] if value else ""
    if isinstance(value, bytes):
        value = value.decode()
    text = str(value or "")
    try:
        return base64.b64decode(text, validate=True).decode()
    except ValueError:
        return text


def _matches(group: Any, state: Any) -> bool:
    version = group.ec2_launch_template.get_version(group.launch_template_version)
    inst = state.instance
    tags = {t["key"]: t["value"] for t in inst.get_tags()}
    same_tags = all(tags.get(k) == v for k, v in (version.instance_tags or {}).items())
    same_data = _text(version.data.get("UserData")) == _text(inst.user_data)
    return bool(inst.image_id == version.data.get("ImageId") and same_tags and same_data)


class FakeInstanceRefresh:
    """The three instance-refresh calls, as methods moto's AutoScalingResponse dispatches to."""

    @staticmethod
    def start_instance_refresh(self: Any) -> ActionResult:
        name = self._get_param("AutoScalingGroupName")
        backend = self.autoscaling_backend
        if name not in backend.autoscaling_groups:
            raise ValidationError(f"AutoScalingGroup name not found - {name}")
        strategy = self._get_param("Strategy") or "Rolling"
        if strategy != "Rolling":
            raise ValidationError(
                f"1 validation error detected: Value '{strategy}' at 'strategy' failed to satisfy constraint"
            )
        prefs = self._get_param("Preferences") or {}
        min_healthy = int(prefs.get("MinHealthyPercentage", 90))
        if not 0 <= min_healthy <= 100:
            raise ValidationError("MinHealthyPercentage must be between 0 and 100")
        if int(prefs.get("InstanceWarmup", 0)) < 0:
            raise ValidationError("InstanceWarmup must be 0 or more")
        group = backend.autoscaling_groups[name]
        history = _REFRESHES.setdefault(group.arn, [])
        if any(r["Status"] in ("Pending", "InProgress") for r in history):
            raise InstanceRefreshInProgress(
                "An Instance Refresh is already in progress and blocks the execution of this Instance Refresh."
            )
        skip = str(prefs.get("SkipMatching", False)).lower() == "true"
        todo = [s for s in group.active_instances() if not (skip and _matches(group, s))]
        desired = int(group.desired_capacity or 0)
        floor = -(-desired * min_healthy // 100)  # ceil: never fewer in service than this
        batch = max(1, len(group.active_instances()) - floor)
        replaced: list[str] = []
        while todo:
            now, todo = todo[:batch], todo[batch:]
            for state in now:
                backend.terminate_instance(state.instance.id, should_decrement=False)
                replaced.append(state.instance.id)
            if len(group.active_instances()) < floor:  # moto replaced nothing: AWS would fail the refresh
                raise ValidationError("instance refresh could not keep MinHealthyPercentage")
        refresh = {
            "InstanceRefreshId": str(uuid.uuid4()),
            "AutoScalingGroupName": name,
            "Status": "Successful",
            "StatusReason": f"fake: replaced {len(replaced)} instance(s) in batches of {batch}",
            "StartTime": datetime.now(timezone.utc),
            "EndTime": datetime.now(timezone.utc),
            "PercentageComplete": 100,
            "InstancesToUpdate": 0,
            "Preferences": {"MinHealthyPercentage": min_healthy, "SkipMatching": skip},
        }
        history.insert(0, refresh)
        return ActionResult({"InstanceRefreshId": refresh["InstanceRefreshId"]})

    @staticmethod
    def describe_instance_refreshes(self: Any) -> ActionResult:
        name = self._get_param("AutoScalingGroupName")
        group = self.autoscaling_backend.autoscaling_groups.get(name)
        if group is None:
            raise ValidationError(f"AutoScalingGroup name not found - {name}")
        return ActionResult({"InstanceRefreshes": list(_REFRESHES.get(group.arn, []))})

    @staticmethod
    def cancel_instance_refresh(self: Any) -> ActionResult:
        name = self._get_param("AutoScalingGroupName")
        group = self.autoscaling_backend.autoscaling_groups.get(name)
        if group is None:
            raise ValidationError(f"AutoScalingGroup name not found - {name}")
        raise ActiveInstanceRefreshNotFound("No in progress or pending Instance Refresh found for this group.")


def _version_keeps_user_data_encoded(original: Any) -> Any:
    """moto 5.2's CreateLaunchTemplateVersion stores UserData unparsed (CreateLaunchTemplate parses it),
    and its Auto Scaling then fails an assertion launching from that version; parse it the same way."""

    def create_launch_template_version(self: Any) -> Any:
        raw = self._get_param("LaunchTemplateData.UserData")
        if raw is not None:
            params = self._get_param("LaunchTemplateData", {})
            params["UserData"] = parse_user_data(raw)
        return original(self)

    return create_launch_template_version


def install() -> None:
    """Add the fake's calls to moto's AutoScaling responder (in this process: start moto after)."""
    for call in ("start_instance_refresh", "describe_instance_refreshes", "cancel_instance_refresh"):
        setattr(AutoScalingResponse, call, getattr(FakeInstanceRefresh, call))
    if not getattr(LaunchTemplates.create_launch_template_version, "_calque_fixed", False):
        fixed = _version_keeps_user_data_encoded(LaunchTemplates.create_launch_template_version)
        fixed._calque_fixed = True  # type: ignore[attr-defined]
        LaunchTemplates.create_launch_template_version = fixed


def reset() -> None:
    _REFRESHES.clear()
