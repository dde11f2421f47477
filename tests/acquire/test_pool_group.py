"""A pool's launch template and Auto Scaling group (``calque.ops.pool_group``) against the moto server.

Instance refresh is the strict fake in tests/support/fake_instance_refresh.py (moto 5.2 lacks it);
everything else is moto's own Auto Scaling, EC2, SSM and IAM.
"""

from __future__ import annotations

from typing import Any

import pytest
from calque.aws.clients import client
from calque.errors import RefusedError, UsageError
from calque.models.pool_names import pool_names
from calque.ops.base import AwsSession
from calque.ops.pool_group import PoolGroupOp
from calque.ops.pool_group_models import PoolGroupRequest

from .conftest import AL2023, Network

CONSENT = {"i_understand_this_spends_money": True, "i_understand_this_terminates_instances": True}


@pytest.fixture
def make(network: Network) -> Any:
    def request(**kw: Any) -> PoolGroupRequest:
        base: dict[str, Any] = {
            "pool": "lab-a/embedder",
            "count": 2,
            "max_size": 4,
            "instance_types": ["g6.xlarge", "g5.xlarge"],
            "subnets": network.subnets,
            "ami_ssm_parameter": AL2023,
            "user_data": "#!/bin/sh\necho queue-a\n",
            "max_hourly_usd": 50,
            **CONSENT,
        }
        base.update(kw)
        return PoolGroupRequest(**base)

    return request


def run(req: PoolGroupRequest, check: bool = False) -> Any:
    return PoolGroupOp(AwsSession()).run(req, check_mode=check)


def group(pool: str = "lab-a/embedder") -> dict[str, Any]:
    name = pool_names(pool).group
    return dict(
        client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    )


def test_from_nothing_makes_a_hardened_template_and_a_mixed_spot_group_then_changes_nothing(make: Any) -> None:
    out = run(make())
    assert out.changed and out.result.desired == 2 and len(out.result.instances) == 2
    g = group()
    mip = g["MixedInstancesPolicy"]
    assert [o["InstanceType"] for o in mip["LaunchTemplate"]["Overrides"]] == ["g6.xlarge", "g5.xlarge"]
    assert mip["InstancesDistribution"]["SpotAllocationStrategy"] == "price-capacity-optimized"
    assert g["CapacityRebalance"] is True
    assert {t["Key"]: t["Value"] for t in g["Tags"]}["calque:pool"] == "lab-a/embedder"
    ec2 = client("ec2")
    name = pool_names("lab-a/embedder").template
    data = ec2.describe_launch_template_versions(LaunchTemplateName=name)["LaunchTemplateVersions"][0]
    lt = data["LaunchTemplateData"]
    assert lt["MetadataOptions"]["HttpTokens"] == "required" and lt["MetadataOptions"]["HttpPutResponseHopLimit"] == 2
    assert lt["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True
    again = run(make())
    assert not again.changed and again.actions == []


def test_the_gate_refuses_the_worst_case_before_anything_exists(make: Any) -> None:
    with pytest.raises(RefusedError, match="max_hourly_usd"):
        PoolGroupOp(AwsSession()).plan(make(max_size=40, max_hourly_usd=5, gate_only=True))
    assert client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"] == []


def test_raising_count_scales_out_and_lowering_needs_the_terminate_consent(make: Any) -> None:
    run(make())
    assert run(make(count=3)).result.desired == 3
    assert len(group()["Instances"]) == 3
    with pytest.raises(RefusedError, match="i_understand_this_terminates_instances"):
        run(make(count=1, i_understand_this_terminates_instances=False))
    assert len(group()["Instances"]) == 3
    out = run(make(count=1))
    assert out.changed and len(group()["Instances"]) == 1


def test_a_spec_change_rolls_the_group_to_a_new_template_version(make: Any) -> None:
    first = run(make())
    old = set(first.result.instances)
    plan = run(make(user_data="#!/bin/sh\necho queue-b\n"), check=True)
    assert plan.changed and set(plan.after["rolls"]) == old  # the diff says what will roll
    out = run(make(user_data="#!/bin/sh\necho queue-b\n"))
    assert out.result.template_version == 2 and out.result.refresh_id
    now = {i["InstanceId"] for i in group()["Instances"]}
    assert len(now) == 2 and not (now & old)
    tags = client("ec2").describe_tags(Filters=[{"Name": "resource-id", "Values": sorted(now)}])["Tags"]
    configs = {t["Value"] for t in tags if t["Key"] == "calque:config"}
    assert configs == {out.result.config}
    assert not run(make(user_data="#!/bin/sh\necho queue-b\n")).changed


def test_an_unhealthy_instance_is_replaced(make: Any) -> None:
    first = run(make())
    sick = first.result.instances[0]
    client("autoscaling").set_instance_health(InstanceId=sick, HealthStatus="Unhealthy")
    out = run(make())
    assert out.result.replaced == [sick]
    now = [i["InstanceId"] for i in group()["Instances"]]
    assert sick not in now and len(now) == 2


def test_another_pools_group_is_never_adopted(make: Any) -> None:
    run(make())
    name = pool_names("lab-a/embedder").group
    client("autoscaling").create_or_update_tags(
        Tags=[
            {
                "ResourceId": name,
                "ResourceType": "auto-scaling-group",
                "Key": "calque:pool",
                "Value": "lab-b/x",
                "PropagateAtLaunch": True,
            }
        ]
    )
    with pytest.raises(RefusedError, match="lab-b/x"):
        run(make())


def test_check_mode_fails_on_a_missing_instance_profile_or_security_group(make: Any, network: Network) -> None:
    with pytest.raises(UsageError, match="instance profile 'nope' does not exist"):
        run(make(instance_profile="nope"), check=True)
    with pytest.raises(UsageError, match="security group 'sg-0123456789abcdef0' does not exist"):
        run(make(security_groups=["sg-0123456789abcdef0"]), check=True)
    assert client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"] == []


def test_two_labs_pools_of_one_model_coexist_and_one_teardown_leaves_the_other(make: Any) -> None:
    run(make())
    run(make(pool="lab-b/embedder"))
    gone = run(make(pool="lab-a/embedder", state="absent"))
    assert gone.changed
    names = [
        g["AutoScalingGroupName"] for g in client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"]
    ]
    assert names == [pool_names("lab-b/embedder").group]
    assert len(group("lab-b/embedder")["Instances"]) == 2


def test_a_capacity_block_is_the_templates_market_and_target_and_the_group_names_the_template_alone(
    make: Any,
) -> None:
    """A class (or pool) naming an EC2 Capacity Block: its launch template carries the capacity-block
    market type and the block as its Capacity Reservation target (what moto 5.2 keeps; it implements no
    Capacity Reservations, so nothing checks the block exists or launches into it), the group uses that
    template with no mixed instances policy; a block with Spot, two types or a warm pool is refused."""
    block = "cr-0123456789abcdef0"
    req = make(pool="fleet/teaching", market="on-demand", instance_types=["p5.48xlarge"], count=1, max_size=1,
               max_hourly_usd=60, capacity_block=block)  # fmt: skip
    assert run(req).changed
    name = pool_names("fleet/teaching")
    lt = client("ec2").describe_launch_template_versions(LaunchTemplateName=name.template)["LaunchTemplateVersions"]
    data = lt[0]["LaunchTemplateData"]
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"] == {"CapacityReservationTarget": {"CapacityReservationId": block}}
    g = group("fleet/teaching")
    assert "MixedInstancesPolicy" not in g and g["LaunchTemplate"]["LaunchTemplateId"] == lt[0]["LaunchTemplateId"]
    assert not run(req).changed  # a second run changes nothing
    one: dict[str, Any] = {"market": "on-demand", "instance_types": ["p5.48xlarge"], "count": 1, "max_size": 1}
    for bad in ({"market": "spot"}, {"instance_types": ["p5.48xlarge", "p4d.24xlarge"]}):
        with pytest.raises(ValueError, match="Capacity Block is one instance type"):
            make(capacity_block=block, **{**one, **bad})
    with pytest.raises(ValueError, match="capacity_block"):
        make(capacity_block="sg-0123456789abcdef0")  # not a capacity reservation id
