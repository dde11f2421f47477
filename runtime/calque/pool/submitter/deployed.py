"""A deployed pool found by its name, as ``modal.Cls.from_name(app, name)`` finds a deployed app.

A named pool's Auto Scaling group carries the ``calque:pool`` tag (``calque pool list``), and its
launch template's user-data carries the pool's spec (``calque.pool.bootstrap.worker_user_data``
writes it, base64, to ``/etc/calque/pool.yaml``). ``deployed_spec`` reads that spec back: the same
file ``playbooks/pool.yml`` wrote at ``calque_pool_spec_path``, found with nothing but the name.

A pool with no group (a cohort of fixed instances launched with ``calque.gpu.ec2_cohort``'s ``pool``
option and the worker's user-data, as ``calque ramp`` launches its instance) is found the same way
through its instances: each carries the ``calque:pool`` tag, and its user-data (the cohort's TTL
part, then the worker's) carries the spec; the newest running one is read. Workers with no EC2
instance behind them (on-premises hosts) carry no tag: their spec is passed with ``--pool``.
"""

from __future__ import annotations

import base64
import binascii
import email
import re
from typing import Any

import yaml
from pydantic import ValidationError

from calque.aws.acquire.group import pool_groups
from calque.aws.acquire.named_pools import pool_of, tagged_instances
from calque.aws.aws_errors import aws_errors
from calque.errors import UsageError, format_validation_error
from calque.models import PoolSpec
from calque.models.pool_names import POOL_TAG

_SPEC = re.compile(r"<<'CALQUE_SPEC'\n(?P<b64>.*?)\nCALQUE_SPEC", re.S)


def _template(group: dict[str, Any]) -> dict[str, Any]:
    spec = group.get("LaunchTemplate") or group.get("MixedInstancesPolicy", {}).get("LaunchTemplate", {}).get(
        "LaunchTemplateSpecification", {}
    )
    return dict(spec)


def spec_of_user_data(user_data: str, where: str) -> PoolSpec:
    """The PoolSpec a worker's user-data writes; UsageError when it carries none."""
    texts = [user_data]
    if user_data.lstrip().lower().startswith(("content-type:", "mime-version:")):  # the template's multipart
        parts = email.message_from_string(user_data).walk()
        texts = [p.get_payload(decode=True).decode("utf-8", "replace") for p in parts if not p.is_multipart()]  # type: ignore[union-attr]
    m = next((found for t in texts if (found := _SPEC.search(t))), None)
    if m is None:
        raise UsageError(f"{where}: its user-data writes no calque pool spec (not made by calque's pool.yml)")
    try:
        doc = yaml.safe_load(base64.b64decode("".join(m.group("b64").split()), validate=True))
        return PoolSpec.model_validate(doc)
    except (binascii.Error, yaml.YAMLError, ValueError) as exc:
        detail = format_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
        raise UsageError(f"{where}: the pool spec in its user-data cannot be read ({detail})") from None


def _checked(spec: PoolSpec, pool: str, where: str) -> PoolSpec:
    if spec.pool not in (None, pool):
        raise UsageError(f"{where} carries the spec of pool {spec.pool}: refusing it")
    return spec


def _instance_spec(ec2: Any, pool: str, instance: dict[str, Any]) -> PoolSpec:
    """The spec in the user-data of one of the pool's tagged instances (a cohort's: no group)."""
    iid = instance["InstanceId"]
    with aws_errors(f"read the user-data of pool {pool}'s instance {iid}"):
        attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")
    text = base64.b64decode(attr.get("UserData", {}).get("Value", "")).decode("utf-8", "replace")
    where = f"pool {pool}'s instance {iid}"
    return _checked(spec_of_user_data(text, where), pool, where)


def deployed_spec(pool: str, asg: Any, ec2: Any) -> PoolSpec:
    """The spec of the deployed pool named ``pool``: its tagged group's launch template, else its tagged instances'."""
    groups = [g for g in pool_groups(asg) if any(t["Key"] == POOL_TAG and t["Value"] == pool for t in g["Tags"])]
    if not groups:
        instances = tagged_instances(ec2, pool)
        if instances:
            return _instance_spec(ec2, pool, instances[0])
        names = {t["Value"] for g in pool_groups(asg) for t in g["Tags"] if t["Key"] == POOL_TAG}
        names |= {p for i in tagged_instances(ec2, None) if (p := pool_of(i))}
        raise UsageError(
            f"no deployed pool named {pool!r} in this account and region (the pools tagged here: "
            f"{', '.join(sorted(names)) or 'none'}); deploy one with playbooks/pool.yml, or pass its spec with "
            "--pool SPEC"
        )
    lt = _template(groups[0])
    ref = {"LaunchTemplateId": lt["LaunchTemplateId"]} if "LaunchTemplateId" in lt else {
        "LaunchTemplateName": lt.get("LaunchTemplateName", "")}  # fmt: skip
    version = str(lt.get("Version") or "$Default")
    with aws_errors(f"read the launch template of pool {pool}"):
        got = ec2.describe_launch_template_versions(**ref, Versions=[version])["LaunchTemplateVersions"]
    data = got[0].get("LaunchTemplateData", {}) if got else {}
    text = base64.b64decode(data.get("UserData", "")).decode("utf-8", "replace")
    where = f"pool {pool}'s launch template"
    return _checked(spec_of_user_data(text, where), pool, where)
