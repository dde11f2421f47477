"""A pool's EC2 Auto Scaling warm pool and its launching lifecycle hook (Layer 0).

A warm pool holds instances that launched once, ran the bootstrap up to "ready" (driver check,
runtime and wheelhouse installed, workload downloaded, its declared weights fetched into the local
cache) and then stopped; scale-out starts one instead of booting a new one, and its worker comes up
without repeating the bootstrap (``calque.pool.worker.instance_ready``). An instance enters the warm pool only
through the ``calque-ready`` hook on ``autoscaling:EC2_INSTANCE_LAUNCHING``: the bootstrap completes
it CONTINUE once ready and ABANDON when a step failed (AWS then terminates the instance). The same
hook holds an instance leaving the warm pool for service until its worker's checks pass.

AWS refuses a warm pool on a group with a mixed instances policy or one that requests Spot
(PutWarmPool's API reference), so a warmed pool is on-demand with one instance type and its group
names the launch template directly.

Hibernation (the ``Hibernated`` state keeps RAM, so a loaded model survives) is possible only for
the instance families AWS lists in "Hibernation prerequisites" (Amazon EC2 User Guide,
docs.aws.amazon.com/AWSEC2/latest/UserGuide/hibernating-prerequisites.html and its
docs.amazonaws.cn copy, read 2026-12-01): general purpose M3, M4, M5, M5a, M5ad, M5d, M6i, M6id,
M7i, M7i-flex, T2, T3, T3a; compute optimized C3, C4, C5, C5d, C6i, C6id; memory optimized R3, R4,
R5, R5a, R5ad, R5d; storage optimized I3, I3en; RAM at most 150 GiB, no bare metal, an encrypted
EBS root volume large enough for RAM. No GPU family (G, P, Inf, Trn) is on that list, so every
GPU type of calque's rates table is refused ``Hibernated``: use ``Stopped``.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from calque.aws.aws_errors import aws_errors, error_code
from calque.models.warmth import WarmPoolSettings

LAUNCH_HOOK = "calque-ready"
"""The lifecycle hook the bootstrap completes once the instance is ready (the same name in every pool)."""
HIBERNATION_FAMILIES = frozenset(
    {
        "m3", "m4", "m5", "m5a", "m5ad", "m5d", "m6i", "m6id", "m7i", "m7i-flex", "t2", "t3", "t3a",  # general
        "c3", "c4", "c5", "c5d", "c6i", "c6id",  # compute optimized
        "r3", "r4", "r5", "r5a", "r5ad", "r5d",  # memory optimized
        "i3", "i3en",  # storage optimized
    }
)  # fmt: skip
HIBERNATION_SOURCE = "AWS EC2 User Guide, 'Hibernation prerequisites' (instance families), read 2026-12-01"


def supports_hibernation(instance_type: str) -> bool:
    """Whether AWS lists ``instance_type``'s family for hibernation (bare metal never)."""
    family, _, size = instance_type.partition(".")
    return family in HIBERNATION_FAMILIES and not size.startswith("metal")


def warm_pool_doc(settings: WarmPoolSettings) -> dict[str, Any]:
    """PutWarmPool's arguments (without the group's name), in the shape DescribeWarmPool answers."""
    doc: dict[str, Any] = {
        "PoolState": settings.state,
        "MinSize": settings.min_size,
        "InstanceReusePolicy": {"ReuseOnScaleIn": settings.reuse_on_scale_in},
    }
    if settings.max_prepared is not None:
        doc["MaxGroupPreparedCapacity"] = settings.max_prepared
    return doc


def launch_hook_doc(settings: WarmPoolSettings) -> dict[str, Any]:
    """The ``calque-ready`` hook: a launch waits for the bootstrap; silence abandons the instance."""
    return {
        "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING",
        "HeartbeatTimeout": settings.ready_timeout,
        "DefaultResult": "ABANDON",
    }


def describe_warm_pool(asg: Any, group: str) -> tuple[dict[str, Any] | None, int]:
    """The group's warm pool as ``warm_pool_doc`` shapes it (None when it has none), and its instance count."""
    with aws_errors(f"describe the warm pool of {group!r}"):
        found = asg.describe_warm_pool(AutoScalingGroupName=group)
    config = found.get("WarmPoolConfiguration")
    if not config or config.get("Status") == "PendingDelete":
        return None, 0
    doc: dict[str, Any] = {
        "PoolState": config.get("PoolState", "Stopped"),
        "MinSize": int(config.get("MinSize", 0)),
        "InstanceReusePolicy": {"ReuseOnScaleIn": bool(config.get("InstanceReusePolicy", {}).get("ReuseOnScaleIn"))},
    }
    if config.get("MaxGroupPreparedCapacity") not in (None, -1):  # AWS answers -1 for "not set"
        doc["MaxGroupPreparedCapacity"] = int(config["MaxGroupPreparedCapacity"])
    return doc, len(found.get("Instances", []))


def describe_launch_hook(asg: Any, group: str) -> dict[str, Any] | None:
    """The ``calque-ready`` hook, only the fields ``launch_hook_doc`` sets; None when absent."""
    with aws_errors(f"describe the lifecycle hooks of {group!r}"):
        hooks = asg.describe_lifecycle_hooks(AutoScalingGroupName=group)["LifecycleHooks"]
    hook = next((h for h in hooks if h["LifecycleHookName"] == LAUNCH_HOOK), None)
    if hook is None:
        return None
    return {k: hook.get(k) for k in ("LifecycleTransition", "HeartbeatTimeout", "DefaultResult")}


def put_launch_hook(asg: Any, group: str, doc: dict[str, Any]) -> None:
    with aws_errors(f"put lifecycle hook {LAUNCH_HOOK} on {group!r}"):
        asg.put_lifecycle_hook(AutoScalingGroupName=group, LifecycleHookName=LAUNCH_HOOK, **doc)


def put_warm_pool(asg: Any, group: str, doc: dict[str, Any]) -> None:
    with aws_errors(f"put the warm pool of {group!r}"):
        asg.put_warm_pool(AutoScalingGroupName=group, **doc)


def delete_warm_pool(asg: Any, group: str) -> None:
    """Delete the group's warm pool and its instances (ForceDelete: they hold no claims)."""
    try:
        asg.delete_warm_pool(AutoScalingGroupName=group, ForceDelete=True)
    except ClientError as exc:
        if error_code(exc) not in ("ValidationError", "ResourceContention") or "not found" not in str(exc).lower():
            with aws_errors(f"delete the warm pool of {group!r}"):
                raise


def delete_launch_hook(asg: Any, group: str) -> None:
    with aws_errors(f"delete lifecycle hook {LAUNCH_HOOK} of {group!r}"):
        asg.delete_lifecycle_hook(AutoScalingGroupName=group, LifecycleHookName=LAUNCH_HOOK)
