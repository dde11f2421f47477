"""The Acquirer against the moto server: hardening, idempotence, scale down, tag-scoped release,
the capacity sweep (with capacity injected at the botocore layer), min_viable, spot fallback."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest
from calque.aws.acquire import Acquirer, Consent
from calque.aws.acquire.launch_spec import TAG_COHORT, TAG_EXPIRES
from calque.errors import InfrastructureError, UsageError

from .capacity import CapacityFaults
from .conftest import AL2023, Network

SPEND = Consent(spend=True)
BOTH = Consent(spend=True, terminate=True)


def live(ec2: Any, **tag: str) -> list[dict[str, Any]]:
    filters = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    filters += [{"Name": f"tag:{k}", "Values": [v]} for k, v in tag.items()]
    return [i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]


def test_every_launched_instance_is_hardened(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    spec = spec_for(count=2, user_data="#!/bin/bash\necho hello-from-the-lab\n", tags={"lab": "bio"})
    spec.root_volume.size_gib, spec.root_volume.type = 200, "gp3"
    result = acquirer.apply(spec, SPEND)

    assert result.changed and len(result.launched) == 2 and result.shortfall == 0
    assert result.hourly_usd == pytest.approx(2 * 0.8048)
    for inst in live(ec2, **{TAG_COHORT: "lab-a"}):
        iid = inst["InstanceId"]
        assert inst["MetadataOptions"]["HttpTokens"] == "required"
        assert inst["MetadataOptions"]["HttpPutResponseHopLimit"] == 2
        vol_id = inst["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
        vol = ec2.describe_volumes(VolumeIds=[vol_id])["Volumes"][0]
        assert vol["Encrypted"] and vol["Size"] == 200 and vol["VolumeType"] == "gp3"
        attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior")
        assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags["lab"] == "bio" and tags["calque:managed-by"] == "calque"
        assert tags[TAG_EXPIRES].endswith("Z")
        raw = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
        user_data = base64.b64decode(raw).decode()
        assert "#cloud-boothook" in user_data and "poweroff" in user_data
        assert tags[TAG_EXPIRES] in user_data  # the TTL the instance enforces is the one the tag shows
        assert "echo hello-from-the-lab" in user_data
    azs = {i.availability_zone for i in result.instances}
    assert len(azs) == 2  # spread over subnets, not piled into the first


def test_second_apply_launches_nothing(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    first = acquirer.apply(spec_for(count=3), SPEND)
    again = acquirer.apply(spec_for(count=3), SPEND)
    assert len(first.launched) == 3
    assert not again.changed and again.launched == [] and len(again.instances) == 3
    assert len(live(ec2, **{TAG_COHORT: "lab-a"})) == 3


def test_raising_the_count_launches_only_the_difference(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    acquirer.apply(spec_for(count=2), SPEND)
    more = acquirer.apply(spec_for(count=5), SPEND)
    assert len(more.launched) == 3 and len(more.instances) == 5


def test_scale_down_terminates_the_newest_first(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    old = acquirer.apply(spec_for(count=2), SPEND).launched
    time.sleep(1.1)  # moto's launch times have one-second resolution
    new = acquirer.apply(spec_for(count=4), SPEND).launched
    down = acquirer.apply(spec_for(count=2), BOTH)
    assert sorted(down.terminated) == sorted(new)
    assert sorted(i["InstanceId"] for i in live(ec2, **{TAG_COHORT: "lab-a"})) == sorted(old)


def test_release_never_touches_untagged_instances_or_other_cohorts(
    ec2: Any, acquirer: Acquirer, spec_for: Any, network: Network
) -> None:
    stranger = ec2.run_instances(ImageId=network.ami, MinCount=1, MaxCount=1, InstanceType="g6.xlarge")
    stranger_id = stranger["Instances"][0]["InstanceId"]
    acquirer.apply(spec_for(name="lab-a", count=2), SPEND)
    other = acquirer.apply(spec_for(name="lab-b", count=1), SPEND).launched

    released = acquirer.release("lab-a", Consent(terminate=True))

    assert len(released.terminated) == 2 and released.instances == []
    still = {i["InstanceId"] for i in live(ec2)}
    assert stranger_id in still and set(other) <= still
    assert not acquirer.release("lab-a", Consent(terminate=True)).changed


def test_sweep_moves_to_the_next_type_when_the_first_is_out_everywhere(
    ec2: Any, acquirer: Acquirer, spec_for: Any
) -> None:
    faults = CapacityFaults(ec2)
    for az in ("us-east-1a", "us-east-1b", "us-east-1c"):
        faults.out_of_capacity("g6.xlarge", az)
    result = acquirer.apply(spec_for(count=6, instance_types=["g6.xlarge", "g6e.xlarge"]), SPEND)
    assert [i.instance_type for i in result.instances] == ["g6e.xlarge"] * 6
    assert sorted({i.availability_zone for i in result.instances}) == ["us-east-1a", "us-east-1b", "us-east-1c"]
    tried = [(a.instance_type, a.error_code) for a in result.attempts]
    assert tried[:3] == [("g6.xlarge", "InsufficientInstanceCapacity")] * 3
    assert {t for t, _ in tried[3:]} == {"g6e.xlarge"}


def test_sweep_keeps_the_preferred_type_in_the_azs_that_have_it(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    CapacityFaults(ec2).out_of_capacity("g6.xlarge", "us-east-1a").out_of_capacity("g6.xlarge", "us-east-1b")
    result = acquirer.apply(spec_for(count=6, instance_types=["g6.xlarge", "g6e.xlarge"]), SPEND)
    assert {(i.instance_type, i.availability_zone) for i in result.instances} == {("g6.xlarge", "us-east-1c")}
    assert len(result.instances) == 6


def test_min_viable_succeeds_short_and_reports_the_shortfall(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    CapacityFaults(ec2).limit("g6.xlarge", "us-east-1a", 2).limit("g6.xlarge", "us-east-1b", 1).limit(
        "g6.xlarge", "us-east-1c", 0
    )
    result = acquirer.apply(spec_for(count=5, min_viable=3), SPEND)
    assert len(result.instances) == 3 and result.shortfall == 2 and result.requested == 5
    assert any("2 short of count" in w for w in result.warnings)


def test_below_min_viable_fails_and_cleans_up_what_it_launched(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    CapacityFaults(ec2).limit("g6.xlarge", "us-east-1a", 2).limit("g6.xlarge", "us-east-1b", 1).limit(
        "g6.xlarge", "us-east-1c", 0
    )
    with pytest.raises(InfrastructureError) as err:
        acquirer.apply(spec_for(count=5, min_viable=4), SPEND)
    assert "at least 4" in str(err.value) and "terminated the 3 launched" in str(err.value)
    assert live(ec2, **{TAG_COHORT: "lab-a"}) == []


def test_below_min_viable_without_cleanup_leaves_them_and_says_so(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    CapacityFaults(ec2).limit("g6.xlarge", "us-east-1a", 1).limit("g6.xlarge", "us-east-1b", 0).limit(
        "g6.xlarge", "us-east-1c", 0
    )
    with pytest.raises(InfrastructureError, match="left running: i-"):
        acquirer.apply(spec_for(count=3, cleanup_on_failure=False), SPEND)
    assert len(live(ec2, **{TAG_COHORT: "lab-a"})) == 1


def test_spot_falls_back_to_on_demand(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    faults = CapacityFaults(ec2)
    for az in ("us-east-1a", "us-east-1b", "us-east-1c"):
        faults.out_of_capacity("g6.xlarge", az, "InsufficientInstanceCapacity", market="spot")
    result = acquirer.apply(spec_for(count=3, market="spot-then-on-demand"), SPEND)
    assert [i.lifecycle for i in result.instances] == ["on-demand"] * 3
    assert [a.market for a in result.attempts[:3]] == ["spot"] * 3


def test_spot_when_there_is_spot_capacity(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    result = acquirer.apply(spec_for(count=2, market="spot-then-on-demand"), SPEND)
    assert [i.lifecycle for i in result.instances] == ["spot", "spot"]
    assert {i["InstanceLifecycle"] for i in live(ec2, **{TAG_COHORT: "lab-a"})} == {"spot"}


def test_spot_max_spot_count_error_moves_on_to_on_demand(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    CapacityFaults(ec2).out_of_capacity("g6.xlarge", "*", "MaxSpotInstanceCountExceeded", market="spot")
    result = acquirer.apply(spec_for(count=3, market="spot-then-on-demand"), SPEND)
    assert [i.lifecycle for i in result.instances] == ["on-demand"] * 3
    spot_tries = [a for a in result.attempts if a.market == "spot"]
    assert len(spot_tries) == 3  # one round: the error took out every spot candidate of the class


def test_a_bad_ssm_parameter_is_a_usage_error(acquirer: Acquirer, spec_for: Any) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        acquirer.apply(spec_for(ami_ssm_parameter="/aws/service/nope/ami-id"), SPEND)


def test_an_explicit_ami_is_used(ec2: Any, acquirer: Acquirer, spec_for: Any, network: Network) -> None:
    result = acquirer.apply(spec_for(count=1, ami=network.ami, ami_ssm_parameter=None), SPEND)
    inst = ec2.describe_instances(InstanceIds=result.launched)["Reservations"][0]["Instances"][0]
    assert inst["ImageId"] == network.ami


def test_status_and_plan_change_nothing(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    plan = acquirer.plan(spec_for(count=4))
    assert (plan.current, plan.launch, plan.terminate) == (0, 4, [])
    assert plan.spend.hourly_usd == pytest.approx(4 * 0.8048)
    assert live(ec2) == [] and acquirer.status("lab-a").instances == []


def test_ssm_parameter_is_the_al2023_one_here() -> None:
    assert AL2023.startswith("/aws/service/")


def test_a_non_capacity_error_stops_the_sweep_and_cleans_up(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    CapacityFaults(ec2).out_of_capacity("g6.xlarge", "us-east-1c", "InvalidParameterValue")
    with pytest.raises(UsageError) as err:
        acquirer.apply(spec_for(count=3, instance_types=["g6.xlarge", "g6e.xlarge"]), SPEND)
    assert "InvalidParameterValue" in str(err.value) and "terminated the 2 launched" in str(err.value)
    assert live(ec2) == []
