"""A pool's EC2 Auto Scaling group: read, create, size, roll, heal and delete it (Layer 0).

AWS's engine does the type x AZ sweep (a MixedInstancesPolicy, spot ``price-capacity-optimized``),
replaces lost instances and rolls new template versions (StartInstanceRefresh); calque decides the
group's shape and size behind the spend gate. A group tagged for another pool is never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from calque.aws.acquire.launch_spec import TAG_MANAGED
from calque.aws.acquire.template import TAG_CONFIG
from calque.aws.aws_errors import aws_errors, error_code
from calque.aws.naming import pool_key_base
from calque.models.instance_usage import UsagePlace, usage_prefix
from calque.models.pool_names import POOL_TAG, USAGE_TAG, pool_names, refuse_foreign

MIN_LIFETIME_S = 86400  # AWS's minimum MaxInstanceLifetime; shorter TTLs stay in the user-data
REFRESHING = ("Pending", "InProgress", "Cancelling", "RollbackInProgress", "Baking")


@dataclass
class GroupInstance:
    instance_id: str
    instance_type: str
    availability_zone: str
    lifecycle_state: str
    health: str
    protected: bool
    config: str | None  # the calque:config digest it was launched with


@dataclass
class GroupState:
    """A group as AWS describes it, with its instances."""

    name: str
    min_size: int
    max_size: int
    desired: int
    template_version: str | None
    instances: list[GroupInstance] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def in_service(self) -> list[GroupInstance]:
        return [i for i in self.instances if i.lifecycle_state == "InService"]

    @property
    def unhealthy(self) -> list[GroupInstance]:
        return [i for i in self.instances if i.health.lower() == "unhealthy"]


def describe_group(asg: Any, ec2: Any, name: str, pool: str) -> GroupState | None:
    """The pool's group (None when absent); ForeignPoolError when it is tagged for another pool."""
    with aws_errors(f"describe Auto Scaling group {name!r}"):
        groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    groups = [g for g in groups if g["AutoScalingGroupName"] == name and g.get("Status") != "Delete in progress"]
    if not groups:
        return None
    g = groups[0]
    refuse_foreign("Auto Scaling group", name, g.get("Tags"), pool)
    mip = (g.get("MixedInstancesPolicy") or {}).get("LaunchTemplate", {}).get("LaunchTemplateSpecification", {})
    spec = mip or g.get("LaunchTemplate") or {}  # a warmed pool's group names its template directly
    configs = _instance_configs(ec2, [i["InstanceId"] for i in g.get("Instances", [])])
    instances = [
        GroupInstance(
            instance_id=i["InstanceId"],
            instance_type=i.get("InstanceType", ""),
            availability_zone=i.get("AvailabilityZone", ""),
            lifecycle_state=i.get("LifecycleState", ""),
            health=i.get("HealthStatus", "Healthy"),
            protected=bool(i.get("ProtectedFromScaleIn")),
            config=configs.get(i["InstanceId"]),
        )
        for i in g.get("Instances", [])
    ]
    return GroupState(
        name=name,
        min_size=int(g["MinSize"]),
        max_size=int(g["MaxSize"]),
        desired=int(g["DesiredCapacity"]),
        template_version=str(spec.get("Version")) if spec.get("Version") else None,
        instances=sorted(instances, key=lambda i: i.instance_id),
        raw=g,
    )


def _instance_configs(ec2: Any, ids: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for start in range(0, len(ids), 200):
        with aws_errors("describe the group's instances"):
            pages = ec2.get_paginator("describe_instances").paginate(InstanceIds=list(ids[start : start + 200]))
            for page in pages:
                for res in page.get("Reservations", []):
                    for inst in res.get("Instances", []):
                        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                        if TAG_CONFIG in tags:
                            out[inst["InstanceId"]] = tags[TAG_CONFIG]
    return out


@dataclass
class GroupShape:
    """What calque sets on a group (everything but the desired count)."""

    min_size: int
    max_size: int
    instance_types: list[str]
    subnets: list[str]
    on_demand_base: int
    spot: bool
    max_lifetime_s: int | None
    zones: list[str] = field(default_factory=list)  # used only without subnets (the default VPC)
    mixed: bool = True  # False: the launch template alone (AWS refuses a warm pool beside a mixed policy)


def group_params(name: str, shape: GroupShape, template_id: str, version: int) -> dict[str, Any]:
    """CreateAutoScalingGroup / UpdateAutoScalingGroup arguments (no DesiredCapacity, no Tags)."""
    distribution: dict[str, Any] = {
        "OnDemandBaseCapacity": shape.on_demand_base,
        "OnDemandPercentageAboveBaseCapacity": 0 if shape.spot else 100,
        "OnDemandAllocationStrategy": "prioritized",
    }
    if shape.spot:
        distribution["SpotAllocationStrategy"] = "price-capacity-optimized"
    spec = {"LaunchTemplateId": template_id, "Version": str(version)}
    params: dict[str, Any] = {
        "AutoScalingGroupName": name,
        "MinSize": shape.min_size,
        "MaxSize": shape.max_size,
        "CapacityRebalance": shape.spot,
        "HealthCheckType": "EC2",
        "HealthCheckGracePeriod": 300,
    }
    if shape.mixed:
        overrides = [{"InstanceType": t} for t in shape.instance_types]
        params["MixedInstancesPolicy"] = {
            "LaunchTemplate": {"LaunchTemplateSpecification": spec, "Overrides": overrides},
            "InstancesDistribution": distribution,
        }
    else:  # the template's own instance type (the first of instance_types), on-demand
        params["LaunchTemplate"] = spec
    if shape.subnets:
        params["VPCZoneIdentifier"] = ",".join(shape.subnets)
    elif shape.zones:
        params["AvailabilityZones"] = list(shape.zones)
    if shape.max_lifetime_s is not None:
        params["MaxInstanceLifetime"] = shape.max_lifetime_s
    return params


def shape_of(state: GroupState) -> dict[str, Any]:
    """The parts of a described group that ``group_params`` sets, for comparison and diff."""
    g = state.raw
    mip = g.get("MixedInstancesPolicy") or {}
    dist = mip.get("InstancesDistribution") or {}
    return {
        "min_size": state.min_size,
        "max_size": state.max_size,
        "instance_types": [o.get("InstanceType") for o in mip.get("LaunchTemplate", {}).get("Overrides", [])],
        "subnets": [s for s in (g.get("VPCZoneIdentifier") or "").split(",") if s],
        "on_demand_base": int(dist.get("OnDemandBaseCapacity", 0)),
        "spot": int(dist.get("OnDemandPercentageAboveBaseCapacity", 100)) < 100,
        "mixed": bool(mip),
        "template_version": state.template_version,
    }


def shape_dict(shape: GroupShape) -> dict[str, Any]:
    """What ``group_params`` sets from ``shape``, in the words of ``shape_of`` (minus the version)."""
    return {
        "min_size": shape.min_size,
        "max_size": shape.max_size,
        "instance_types": shape.instance_types if shape.mixed else [],  # plain: the template's type
        "subnets": shape.subnets,
        "on_demand_base": shape.on_demand_base,
        "spot": shape.spot,
        "mixed": shape.mixed,
    }


def default_zones(ec2: Any) -> list[str]:
    """The region's available zones, for a group given no subnets (it launches into the default VPC)."""
    with aws_errors("describe the region's availability zones"):
        zones = ec2.describe_availability_zones(Filters=[{"Name": "state", "Values": ["available"]}])
    return sorted(z["ZoneName"] for z in zones.get("AvailabilityZones", []))


def create_group(asg: Any, params: dict[str, Any], desired: int, tags: dict[str, str]) -> None:
    tag_list = [{"Key": k, "Value": v, "PropagateAtLaunch": True} for k, v in {**tags, TAG_MANAGED: "calque"}.items()]
    with aws_errors(f"create Auto Scaling group {params['AutoScalingGroupName']!r}"):
        asg.create_auto_scaling_group(**params, DesiredCapacity=desired, Tags=tag_list)


def usage_tag(pool: str, bucket: str | None, prefix: str) -> dict[str, str]:
    """Where the group's instances write their usage records, for the ledger to find (none: no bucket given)."""
    if bucket is None:
        return {}
    return {USAGE_TAG: usage_prefix(UsagePlace(bucket, pool_key_base(prefix, pool_names(pool).queue)))}


def tag_group(asg: Any, name: str, tags: dict[str, str]) -> None:
    """Set ``tags`` on an existing group (and its future instances); nothing when there are none."""
    if not tags:
        return
    rows = [
        {"ResourceId": name, "ResourceType": "auto-scaling-group", "Key": k, "Value": v, "PropagateAtLaunch": True}
        for k, v in tags.items()
    ]
    with aws_errors(f"tag Auto Scaling group {name!r}"):
        asg.create_or_update_tags(Tags=rows)


def update_group(asg: Any, params: dict[str, Any]) -> None:
    with aws_errors(f"update Auto Scaling group {params['AutoScalingGroupName']!r}"):
        asg.update_auto_scaling_group(**params)


def set_desired(asg: Any, name: str, desired: int) -> None:
    with aws_errors(f"set the desired capacity of Auto Scaling group {name!r}"):
        asg.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=desired, HonorCooldown=False)


def replace(asg: Any, instance_ids: Sequence[str]) -> list[str]:
    """Terminate ``instance_ids`` keeping the desired count, so the group launches their replacements."""
    done = []
    for iid in instance_ids:
        with aws_errors(f"replace instance {iid}"):
            asg.terminate_instance_in_auto_scaling_group(InstanceId=iid, ShouldDecrementDesiredCapacity=False)
        done.append(iid)
    return done


def refresh_in_progress(asg: Any, name: str) -> dict[str, Any] | None:
    """The group's unfinished instance refresh, if any."""
    with aws_errors(f"describe the instance refreshes of {name!r}"):
        found = asg.describe_instance_refreshes(AutoScalingGroupName=name).get("InstanceRefreshes", [])
    return next((r for r in found if r.get("Status") in REFRESHING), None)


def start_refresh(asg: Any, name: str, min_healthy_percentage: int, warmup_s: int) -> str:
    """A rolling replacement of instances that do not match the group's template version."""
    with aws_errors(f"start an instance refresh of {name!r}"):
        out = asg.start_instance_refresh(
            AutoScalingGroupName=name,
            Strategy="Rolling",
            Preferences={
                "MinHealthyPercentage": min_healthy_percentage,
                "InstanceWarmup": warmup_s,
                "SkipMatching": True,
            },
        )
    return str(out["InstanceRefreshId"])


def delete_group(asg: Any, name: str) -> None:
    """Delete the (already drained) group; ForceDelete ends instances a scale-in left protected."""
    try:
        asg.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
    except ClientError as exc:
        if error_code(exc) != "ValidationError" or "not found" not in str(exc).lower():
            with aws_errors(f"delete Auto Scaling group {name!r}"):
                raise


def pool_groups(asg: Any) -> list[dict[str, Any]]:
    """Every Auto Scaling group in the region that carries the ``calque:pool`` tag."""
    out: list[dict[str, Any]] = []
    with aws_errors("list the Auto Scaling groups of calque pools"):
        pages = asg.get_paginator("describe_auto_scaling_groups").paginate(
            Filters=[{"Name": "tag-key", "Values": [POOL_TAG]}]
        )
        for page in pages:
            out.extend(
                g for g in page.get("AutoScalingGroups", []) if any(t["Key"] == POOL_TAG for t in g.get("Tags", []))
            )
    return out
