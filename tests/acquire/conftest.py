"""Fixtures of the acquisition tests: a VPC with one subnet in each of three AZs on the moto server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from calque.aws.acquire import Acquirer, CohortSpec
from calque.aws.clients import client

AL2023 = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
AZS = ("us-east-1a", "us-east-1b", "us-east-1c")


@dataclass
class Network:
    vpc_id: str
    subnets: list[str]  # one per AZ, in AZS order
    az_of: dict[str, str]
    ami: str


@pytest.fixture
def ec2(moto: str) -> Any:
    return client("ec2")


@pytest.fixture
def network(ec2: Any) -> Network:
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.42.{i}.0/24", AvailabilityZone=az)["Subnet"]["SubnetId"]
        for i, az in enumerate(AZS)
    ]
    ami = client("ssm").get_parameter(Name=AL2023)["Parameter"]["Value"]
    return Network(vpc, subnets, dict(zip(subnets, AZS, strict=True)), ami)


@pytest.fixture
def acquirer(ec2: Any) -> Acquirer:
    return Acquirer(ec2=ec2, waiter_delay_s=1)


@pytest.fixture
def spec_for(network: Network) -> Any:
    def make(**kw: Any) -> CohortSpec:
        base: dict[str, Any] = {
            "name": "lab-a",
            "count": 2,
            "instance_types": ["g6.xlarge"],
            "subnets": network.subnets,
            "ami_ssm_parameter": AL2023,
            "ttl_seconds": "2h",
            "wait_timeout_s": 30,
        }
        base.update(kw)
        return CohortSpec(**base)

    return make
