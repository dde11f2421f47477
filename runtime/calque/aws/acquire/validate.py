"""What a launch needs, checked before anything is made: so a passing check mode means the run will not fail there.

The AMI (given, or read from SSM), the instance profile (IAM), the subnets and the security groups
must exist; each missing one is a UsageError that names it and says what to change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from botocore.exceptions import ClientError

from calque.aws.acquire.launch_spec import resolve_ami
from calque.aws.aws_errors import describe, error_code, is_not_found
from calque.errors import UsageError


def _must_exist(look: Callable[[], Any], missing_code: str, missing: str) -> None:
    """Run ``look``; AWS saying the thing is not there (not found, or a code starting ``missing_code``)
    becomes a UsageError ``missing`` and the error; any other error is the caller's."""
    try:
        look()
    except ClientError as exc:
        if is_not_found(exc) or error_code(exc).startswith(missing_code):
            raise UsageError(f"{missing} ({describe(exc)})") from exc
        raise


def check_instance_profile(iam: Any, profile: str) -> None:
    name = profile.rsplit("/", 1)[-1] if profile.startswith("arn:") else profile
    _must_exist(
        partial(iam.get_instance_profile, InstanceProfileName=name),
        "NoSuchEntity",
        f"instance profile {name!r} does not exist: create it (pool.yml's IAM tasks do, for the pool's "
        "own role) or set instance_profile to one that exists",
    )


def check_security_groups(ec2: Any, groups: Sequence[str]) -> None:
    for sg in groups:  # one by one, so the message names the missing one
        _must_exist(
            partial(ec2.describe_security_groups, GroupIds=[sg]),
            "InvalidGroup",
            f"security group {sg!r} does not exist in this region: create it or remove it from security_groups",
        )


def check_subnets(ec2: Any, subnets: Sequence[str]) -> None:
    for subnet in subnets:
        _must_exist(
            partial(ec2.describe_subnets, SubnetIds=[subnet]),
            "InvalidSubnet",
            f"subnet {subnet!r} does not exist in this region: fix subnets",
        )


def check_launch_inputs(
    ec2: Any,
    ssm: Any,
    iam: Any,
    ami: str | None,
    ami_ssm_parameter: str | None,
    instance_profile: str | None,
    security_groups: Sequence[str],
    subnets: Sequence[str],
) -> tuple[str, str]:
    """Check everything a launch names; the resolved AMI id and root device."""
    image = resolve_ami(ec2, ssm, ami, ami_ssm_parameter)
    if instance_profile:
        check_instance_profile(iam, instance_profile)
    check_subnets(ec2, subnets)
    check_security_groups(ec2, security_groups)
    return image
