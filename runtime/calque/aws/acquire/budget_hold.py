"""A lab over its budget: its pools' groups held at what their running claims need, then at zero, and
released when the month turns or the budget is raised (Layer 0: the Acquirer sizes every group).

A worker holding a claim protects its instance from scale-in (``pool/worker/instance.py``), so the
protected instances are the running claims' needs: the hold sets the group's maximum (and desired)
to their count, lowered again at every round as claims finish, to zero. No new instance starts, and
no instance serving a claim is ended. What the group was before is kept in its ``calque:budget-hold``
tag (``<month> <min> <max>``), so the release puts it back exactly and a restarted broker knows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calque.aws.aws_errors import aws_errors
from calque.models.pool_names import pool_names

HOLD_TAG = "calque:budget-hold"


@dataclass(frozen=True)
class HoldStep:
    """What one round did to one pool's group."""

    pool: str
    action: str  # "held", "released" or "" (nothing to do)
    max_size: int
    running_claims: int


def _group(asg: Any, pool: str) -> dict[str, Any] | None:
    name = pool_names(pool).group
    with aws_errors(f"describe Auto Scaling group {name!r}"):
        found = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return found[0] if found else None


def _hold_tag(g: dict[str, Any]) -> tuple[str, int, int] | None:
    value = next((t["Value"] for t in g.get("Tags", []) if t["Key"] == HOLD_TAG), None)
    try:
        month, lo, hi = str(value).split()
        return month, int(lo), int(hi)
    except ValueError:  # no tag, or one not written by calque: not held
        return None


def _tag(asg: Any, name: str, value: str | None) -> None:
    row = {"ResourceId": name, "ResourceType": "auto-scaling-group", "Key": HOLD_TAG, "PropagateAtLaunch": False}
    with aws_errors(f"tag Auto Scaling group {name!r}"):
        if value is None:
            asg.delete_tags(Tags=[row])
        else:
            asg.create_or_update_tags(Tags=[{**row, "Value": value}])


def hold_pool(asg: Any, pool: str, month: str) -> HoldStep:
    """Lower ``pool``'s group to its running claims' needs (its instances protected by a busy worker)."""
    g = _group(asg, pool)
    if g is None:
        return HoldStep(pool, "", 0, 0)
    name = g["AutoScalingGroupName"]
    busy = sum(1 for i in g.get("Instances", []) if i.get("ProtectedFromScaleIn"))
    held = _hold_tag(g)
    if held is None:  # the group as it was: what the release puts back
        _tag(asg, name, f"{month} {g['MinSize']} {g['MaxSize']}")
    elif held[0] != month:
        _tag(asg, name, f"{month} {held[1]} {held[2]}")
    if g["MaxSize"] == busy and g["MinSize"] == 0 and g["DesiredCapacity"] <= busy:
        return HoldStep(pool, "", busy, busy)
    with aws_errors(f"hold Auto Scaling group {name!r} at its running claims"):
        asg.update_auto_scaling_group(
            AutoScalingGroupName=name, MinSize=0, MaxSize=busy, DesiredCapacity=min(g["DesiredCapacity"], busy)
        )
    return HoldStep(pool, "held", busy, busy)


def release_pool(asg: Any, pool: str) -> HoldStep:
    """Put a held group back as it was before the hold (its policies then size it); nothing if not held."""
    g = _group(asg, pool)
    held = None if g is None else _hold_tag(g)
    if g is None or held is None:
        return HoldStep(pool, "", 0 if g is None else int(g["MaxSize"]), 0)
    name = g["AutoScalingGroupName"]
    with aws_errors(f"release Auto Scaling group {name!r} from its budget hold"):
        asg.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=held[1], MaxSize=held[2])
    _tag(asg, name, None)
    return HoldStep(pool, "released", held[2], 0)


def held_month(asg: Any, pool: str) -> str | None:
    """The month ``pool``'s group is held for (``pool.yml``'s gate refuses to raise it meanwhile)."""
    g = _group(asg, pool)
    held = None if g is None else _hold_tag(g)
    return None if held is None else held[0]
