"""The RunInstances request for one cohort launch, hardened the same way every time.

Every instance gets IMDSv2 required (hop limit 2, so containers on the host reach it), an encrypted
root volume deleted with the instance, ``InstanceInitiatedShutdownBehavior=terminate`` and a hard
TTL: a cloud-init boothook (it runs on every boot) powers the instance off at ``calque:expires-at``,
and powering off terminates it. The caller's own user-data follows as a second MIME part.
"""

from __future__ import annotations

import getpass
import uuid
from datetime import datetime, timedelta, timezone
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any

from calque.aws.aws_errors import aws_errors
from calque.errors import UsageError
from calque.models.acquire import CohortSpec, Lifecycle

TAG_COHORT = "calque:cohort"
TAG_POOL = "calque:pool"
TAG_OWNER = "calque:owner"
TAG_EXPIRES = "calque:expires-at"
TAG_MANAGED = "calque:managed-by"

# AWS Deep Learning Base AMI (NVIDIA driver, Ubuntu 22.04): the default when neither ami nor
# ami_ssm_parameter is given.
DEFAULT_AMI_SSM_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
USER_DATA_LIMIT = 16 * 1024  # EC2's limit on raw user-data

_TTL_BOOTHOOK = """#cloud-boothook
#!/bin/sh
# calque TTL: power off (and so terminate) at {expires_iso}; runs on every boot.
remaining=$(( {expires_epoch} - $(date +%s) ))
if [ "$remaining" -le 30 ]; then
  systemctl poweroff || shutdown -P now
else
  systemd-run --on-active="${{remaining}}s" --unit=calque-ttl-$(date +%s) systemctl poweroff \\
    || shutdown -P "+$(( remaining / 60 ))" &
fi
"""


def expires_at(ttl_seconds: int, now: datetime | None = None) -> datetime:
    return (now or datetime.now(timezone.utc)).replace(microsecond=0) + timedelta(seconds=ttl_seconds)


def iso_z(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _user_part_type(text: str) -> str:
    head = text.lstrip()[:32]
    if head.startswith("#cloud-config"):
        return "cloud-config"
    if head.startswith("#cloud-boothook"):
        return "cloud-boothook"
    if head.startswith("#include"):
        return "x-include-url"
    return "x-shellscript"


def build_user_data(expires: datetime, extra: str | None = None) -> str:
    """A MIME multipart: calque's TTL boothook, then the caller's user-data (script or cloud-config)."""
    if extra and extra.lstrip().lower().startswith(("content-type:", "mime-version:")):
        raise UsageError(
            "user_data is already MIME multipart; give a single shell script or #cloud-config document "
            "(calque adds its TTL part and builds the multipart)"
        )
    outer = MIMEMultipart(boundary="==calque-user-data==")
    ttl = _TTL_BOOTHOOK.format(expires_iso=iso_z(expires), expires_epoch=int(expires.timestamp()))
    outer.attach(MIMEText(ttl, "cloud-boothook"))
    if extra:
        outer.attach(MIMEText(extra, _user_part_type(extra)))
    text = outer.as_string()
    if len(text.encode()) > USER_DATA_LIMIT:
        raise UsageError(
            f"user_data is {len(text.encode())} bytes with calque's TTL part; EC2 allows {USER_DATA_LIMIT}. "
            "Shorten it or fetch the rest from S3 in the script."
        )
    return text


def cohort_tags(spec: CohortSpec, expires: datetime) -> dict[str, str]:
    """The tags every instance (and its root volume) of the cohort carries."""
    try:
        default_owner = getpass.getuser()
    except Exception:  # no passwd entry (containers): still tag something honest
        default_owner = "unknown"
    tags = {"Name": f"calque-{spec.name}", **spec.tags}
    tags.update(
        {
            TAG_COHORT: spec.name,
            TAG_OWNER: spec.owner or default_owner,
            TAG_EXPIRES: iso_z(expires),
            TAG_MANAGED: "calque",
        }
    )
    if spec.pool:
        tags[TAG_POOL] = spec.pool
    return tags


def resolve_ami(ec2: Any, ssm: Any, ami: str | None, parameter: str | None) -> tuple[str, str]:
    """The AMI id (given, or read from the SSM parameter) and its root device name."""
    image_id = ami
    if not image_id:
        name = parameter or DEFAULT_AMI_SSM_PARAMETER
        missing = f"SSM parameter {name!r} does not exist in this region; give ami or another ami_ssm_parameter"
        with aws_errors(f"read SSM parameter {name!r}", missing=missing):
            image_id = str(ssm.get_parameter(Name=name)["Parameter"]["Value"])
    with aws_errors(f"describe AMI {image_id!r}", missing=f"AMI {image_id!r} cannot be used in this region"):
        images = ec2.describe_images(ImageIds=[image_id])["Images"]
    if not images:
        raise UsageError(f"AMI {image_id!r} was not found in this region; give an AMI id that exists here")
    return image_id, str(images[0].get("RootDeviceName") or "/dev/xvda")


def resolve_image(ec2: Any, ssm: Any, spec: CohortSpec) -> tuple[str, str]:
    """A cohort's AMI id and root device name (see :func:`resolve_ami`)."""
    return resolve_ami(ec2, ssm, spec.ami, spec.ami_ssm_parameter)


def run_instances_params(
    spec: CohortSpec,
    *,
    image_id: str,
    root_device: str,
    instance_type: str,
    subnet_id: str | None,
    market: Lifecycle,
    count: int,
    tags: dict[str, str],
    user_data: str,
) -> dict[str, Any]:
    """Keyword arguments for ``ec2.run_instances``: up to ``count`` instances, at least one."""
    tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
    ebs: dict[str, Any] = {
        "VolumeSize": spec.root_volume.size_gib,
        "VolumeType": spec.root_volume.type,
        "Encrypted": True,
        "DeleteOnTermination": True,
    }
    if spec.root_volume.kms_key_id:
        ebs["KmsKeyId"] = spec.root_volume.kms_key_id
    params: dict[str, Any] = {
        "ImageId": image_id,
        "InstanceType": instance_type,
        "MinCount": 1,
        "MaxCount": count,
        "ClientToken": f"calque-{uuid.uuid4().hex}",  # botocore's retries of this call stay idempotent
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 2, "HttpEndpoint": "enabled"},
        "BlockDeviceMappings": [{"DeviceName": root_device, "Ebs": ebs}],
        "InstanceInitiatedShutdownBehavior": "terminate",
        "UserData": user_data,
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tag_list},
            {"ResourceType": "volume", "Tags": tag_list},
        ],
    }
    if subnet_id:
        params["SubnetId"] = subnet_id
    if spec.security_groups:
        params["SecurityGroupIds"] = list(spec.security_groups)
    if spec.key_name:
        params["KeyName"] = spec.key_name
    if spec.instance_profile:
        key = "Arn" if spec.instance_profile.startswith("arn:") else "Name"
        params["IamInstanceProfile"] = {key: spec.instance_profile}
    if market == "spot":
        spot: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if spec.spot_max_price is not None:
            spot["MaxPrice"] = f"{spec.spot_max_price:.4f}"
        params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
    return params
