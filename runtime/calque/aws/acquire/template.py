"""A pool's launch template: one per pool, a new version only when what instances run would change.

Each version is the same hardened launch as a cohort's (IMDSv2 required with hop limit 2, an
encrypted root volume deleted with the instance, shutdown terminates) plus the pool's bootstrap
user-data. Its *config digest* is a hash of what a worker was bootstrapped with (AMI, user-data
without the presigned URLs' signatures, types, profile, security groups, volume): it is written
into the version's description and onto every instance it launches (tag ``calque:config``), so a
roll can tell which instances still run an older spec. A presigned runtime URL expires, so a
version whose URLs have less than half their validity left is renewed (same digest: nothing rolls).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any

from botocore.exceptions import ClientError

from calque.aws.acquire.launch_spec import TAG_MANAGED, USER_DATA_LIMIT, _user_part_type, iso_z
from calque.aws.aws_errors import aws_errors, describe, error_code, is_not_found
from calque.errors import UsageError
from calque.models.pool_names import refuse_foreign

TAG_CONFIG = "calque:config"
_DESCRIPTION = re.compile(r"^calque (?P<digest>[0-9a-f]{16})(?: urls-expire (?P<expires>\S+))?$")
_QUERY = re.compile(r"(https?://[^\s'\"?]+)\?[^\s'\"]*")
_AMZ_DATE = re.compile(r"X-Amz-Date=(\d{8}T\d{6}Z)")
_AMZ_EXPIRES = re.compile(r"X-Amz-Expires=(\d+)")

# A relative TTL (a group launches instances long after its template was made): the first boot
# records the deadline, every boot powers off at it, and powering off terminates the instance.
_TTL_BOOTHOOK = """#cloud-boothook
#!/bin/sh
# calque TTL: power off (and so terminate) {ttl_s}s after the first boot; runs on every boot.
mkdir -p /var/lib/calque
[ -s /var/lib/calque/expires-epoch ] || echo $(( $(date +%s) + {ttl_s} )) > /var/lib/calque/expires-epoch
remaining=$(( $(cat /var/lib/calque/expires-epoch) - $(date +%s) ))
if [ "$remaining" -le 30 ]; then
  systemctl poweroff || shutdown -P now
else
  systemd-run --on-active="${{remaining}}s" --unit=calque-ttl-$(date +%s) systemctl poweroff \\
    || shutdown -P "+$(( remaining / 60 ))" &
fi
"""


def group_user_data(ttl_s: int | None, extra: str | None) -> str:
    """The template's user-data: the relative TTL boothook (None: no poweroff), then ``extra``."""
    if extra and extra.lstrip().lower().startswith(("content-type:", "mime-version:")):
        raise UsageError("user_data is already MIME multipart; give a single shell script or #cloud-config document")
    outer = MIMEMultipart(boundary="==calque-user-data==")
    if ttl_s is not None:
        outer.attach(MIMEText(_TTL_BOOTHOOK.format(ttl_s=int(ttl_s)), "cloud-boothook"))
    if extra:
        outer.attach(MIMEText(extra, _user_part_type(extra)))
    text = outer.as_string()
    if len(text.encode()) > USER_DATA_LIMIT:
        raise UsageError(f"user_data is {len(text.encode())} bytes; EC2 allows {USER_DATA_LIMIT}")
    return text


def urls_expire(user_data: str) -> datetime | None:
    """When the first presigned URL in ``user_data`` stops working (None when it has none)."""
    date, expires = _AMZ_DATE.search(user_data), _AMZ_EXPIRES.search(user_data)
    if not date or not expires:
        return None
    signed = datetime.strptime(date.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    return signed + timedelta(seconds=int(expires.group(1)))


def urls_valid_for(user_data: str) -> timedelta | None:
    """How long the presigned URLs in ``user_data`` were issued for (None when it has none)."""
    m = _AMZ_EXPIRES.search(user_data)
    return timedelta(seconds=int(m.group(1))) if m else None


def config_digest(data: dict[str, Any], user_data: str) -> str:
    """16 hex of what an instance is bootstrapped with; a presigned URL's signature is not part of it."""
    identity = {k: v for k, v in data.items() if k not in ("UserData", "TagSpecifications")}
    identity["user_data"] = _QUERY.sub(r"\1", user_data)
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass
class TemplateInputs:
    """What one version of a pool's launch template is made from."""

    image_id: str
    root_device: str
    instance_type: str  # the first preferred type; the group's overrides list all of them
    user_data: str
    volume_size_gib: int
    volume_type: str
    kms_key_id: str | None
    instance_profile: str | None
    security_groups: list[str]
    key_name: str | None
    tags: dict[str, str]
    hibernate: bool = False  # a Hibernated warm pool: RAM saved to the (encrypted) root volume on stop
    capacity_block: str | None = None  # an EC2 Capacity Block for ML (capacity reservation id) to launch into


def template_data(inp: TemplateInputs) -> tuple[dict[str, Any], str]:
    """``LaunchTemplateData`` for ``inp`` and its config digest."""
    ebs: dict[str, Any] = {
        "VolumeSize": inp.volume_size_gib,
        "VolumeType": inp.volume_type,
        "Encrypted": True,
        "DeleteOnTermination": True,
    }
    if inp.kms_key_id:
        ebs["KmsKeyId"] = inp.kms_key_id
    data: dict[str, Any] = {
        "ImageId": inp.image_id,
        "InstanceType": inp.instance_type,
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 2, "HttpEndpoint": "enabled"},
        "BlockDeviceMappings": [{"DeviceName": inp.root_device, "Ebs": ebs}],
        "InstanceInitiatedShutdownBehavior": "terminate",
    }
    if inp.security_groups:
        data["SecurityGroupIds"] = list(inp.security_groups)
    if inp.key_name:
        data["KeyName"] = inp.key_name
    if inp.hibernate:
        data["HibernationOptions"] = {"Configured": True}
    if inp.capacity_block:  # AWS's way for a group: the market type and the target on its launch template
        data["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
        data["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": inp.capacity_block}
        }
    if inp.instance_profile:
        key = "Arn" if inp.instance_profile.startswith("arn:") else "Name"
        data["IamInstanceProfile"] = {key: inp.instance_profile}
    digest = config_digest({**data, "tags": inp.tags}, inp.user_data)
    tags = [{"Key": k, "Value": v} for k, v in {**inp.tags, TAG_CONFIG: digest}.items()]
    data["TagSpecifications"] = [{"ResourceType": "instance", "Tags": tags}, {"ResourceType": "volume", "Tags": tags}]
    data["UserData"] = base64.b64encode(inp.user_data.encode()).decode()
    return data, digest


@dataclass
class TemplateState:
    """A pool's launch template as it is: its id, newest version and that version's digest."""

    template_id: str
    version: int
    digest: str | None
    urls_expire: datetime | None


def describe_template(ec2: Any, name: str, pool: str) -> TemplateState | None:
    """The pool's template (None when absent); ForeignPoolError when another pool owns that name."""
    try:
        found = ec2.describe_launch_templates(LaunchTemplateNames=[name])["LaunchTemplates"]
    except ClientError as exc:
        if is_not_found(exc) or error_code(exc).startswith("InvalidLaunchTemplateName"):
            return None
        raise
    if not found:
        return None
    tmpl = found[0]
    refuse_foreign("launch template", name, tmpl.get("Tags"), pool)
    with aws_errors(f"describe launch template {name!r}"):
        version = ec2.describe_launch_template_versions(LaunchTemplateId=tmpl["LaunchTemplateId"], Versions=["$Latest"])
    latest = version["LaunchTemplateVersions"][0]
    match = _DESCRIPTION.match(latest.get("VersionDescription") or "")
    expires = datetime.fromisoformat(match["expires"].replace("Z", "+00:00")) if match and match["expires"] else None
    return TemplateState(
        template_id=tmpl["LaunchTemplateId"],
        version=int(latest["VersionNumber"]),
        digest=match["digest"] if match else None,
        urls_expire=expires,
    )


def needs_renewal(state: TemplateState, now: datetime | None = None, issued_for: timedelta | None = None) -> bool:
    """True when the current version's presigned URLs have less than half of ``issued_for`` left."""
    if state.urls_expire is None or issued_for is None:
        return False
    return state.urls_expire - (now or datetime.now(timezone.utc)) < issued_for / 2


def put_version(
    ec2: Any, name: str, state: TemplateState | None, data: dict[str, Any], digest: str, tags: dict[str, str]
) -> TemplateState:
    """Create the template (first version) or a new version of it, made the default; its state."""
    expires = urls_expire(_decoded(data))
    description = f"calque {digest}" + (f" urls-expire {iso_z(expires)}" if expires else "")
    if state is None:
        all_tags = [{"Key": k, "Value": v} for k, v in {**tags, TAG_MANAGED: "calque"}.items()]
        with aws_errors(f"create launch template {name!r}"):
            made = ec2.create_launch_template(
                LaunchTemplateName=name,
                VersionDescription=description,
                LaunchTemplateData=data,
                TagSpecifications=[{"ResourceType": "launch-template", "Tags": all_tags}],
            )["LaunchTemplate"]
        return TemplateState(made["LaunchTemplateId"], int(made["LatestVersionNumber"]), digest, expires)
    with aws_errors(f"create a version of launch template {name!r}"):
        made = ec2.create_launch_template_version(
            LaunchTemplateId=state.template_id, VersionDescription=description, LaunchTemplateData=data
        )["LaunchTemplateVersion"]
        number = int(made["VersionNumber"])
        ec2.modify_launch_template(LaunchTemplateId=state.template_id, DefaultVersion=str(number))
    return TemplateState(state.template_id, number, digest, expires)


def delete_template(ec2: Any, name: str, pool: str) -> bool:
    """Delete the pool's template; False when it was not there."""
    state = describe_template(ec2, name, pool)
    if state is None:
        return False
    with aws_errors(f"delete launch template {name!r}"):
        ec2.delete_launch_template(LaunchTemplateId=state.template_id)
    return True


def dry_run(ec2: Any, data: dict[str, Any], subnet_id: str | None) -> None:
    """EC2's DryRun of one launch as the template would make it; UsageError with EC2's reason if refused."""
    params: dict[str, Any] = {k: v for k, v in data.items() if k != "TagSpecifications"}
    params.update(MinCount=1, MaxCount=1, DryRun=True)
    if subnet_id:
        params["SubnetId"] = subnet_id
    try:
        ec2.run_instances(**params)
    except ClientError as exc:
        if error_code(exc) == "DryRunOperation":
            return
        raise UsageError(
            f"EC2 refused a DryRun launch of the pool's template ({describe(exc)}): fix the AMI, instance type, "
            "profile, subnets or security groups it names"
        ) from exc
    raise UsageError("EC2 accepted a DryRun launch without answering DryRunOperation; is the endpoint EC2?")


def _decoded(data: dict[str, Any]) -> str:
    return base64.b64decode(data.get("UserData", "")).decode("utf-8", "replace")
