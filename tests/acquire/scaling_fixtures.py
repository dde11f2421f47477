"""A pool's Auto Scaling group made directly in moto (the group's own operation is pool_group's)."""

from __future__ import annotations

from typing import Any

from calque.aws.clients import client
from calque.models.pool_names import POOL_TAG, pool_names


def make_group(pool: str, *, desired: int = 1, tag_pool: str | None = None, min_size: int = 0) -> str:
    """Create ``pool``'s launch template and group (tagged for ``tag_pool``, default ``pool``); its name."""
    names = pool_names(pool)
    ec2, asg = client("ec2"), client("autoscaling")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.create_launch_template(
        LaunchTemplateName=names.template, LaunchTemplateData={"ImageId": ami, "InstanceType": "g6.xlarge"}
    )
    asg.create_auto_scaling_group(
        AutoScalingGroupName=names.group,
        LaunchTemplate={"LaunchTemplateName": names.template},
        MinSize=min_size,
        MaxSize=4,
        DesiredCapacity=desired,
        AvailabilityZones=["us-east-1a"],
        Tags=[{"Key": POOL_TAG, "Value": tag_pool or pool, "PropagateAtLaunch": True}],
    )
    return names.group


def group_instances(group: str) -> list[dict[str, Any]]:
    found = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    instances: list[dict[str, Any]] = found[0]["Instances"]
    return instances
