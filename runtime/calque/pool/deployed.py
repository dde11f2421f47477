"""A deployed pool found by its name, as ``modal.Cls.from_name(app, name)`` finds a deployed app.

A named pool's Auto Scaling group carries the ``calque:pool`` tag (``calque pool list``), and its
launch template's user-data carries the pool's spec (``calque.pool.bootstrap.worker_user_data``
writes it, base64, to ``/etc/calque/pool.yml``). ``deployed_spec`` reads that spec back: the same
file ``playbooks/pool.yml`` wrote at ``calque_pool_spec_path``, found with nothing but the name.
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
from calque.aws.errors import aws_errors
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


def deployed_spec(pool: str, asg: Any, ec2: Any) -> PoolSpec:
    """The spec of the deployed pool named ``pool`` (its tagged group's launch template)."""
    groups = [g for g in pool_groups(asg) if any(t["Key"] == POOL_TAG and t["Value"] == pool for t in g["Tags"])]
    if not groups:
        names = sorted({t["Value"] for g in pool_groups(asg) for t in g["Tags"] if t["Key"] == POOL_TAG})
        raise UsageError(
            f"no deployed pool named {pool!r} in this account and region (calque pool list shows "
            f"{', '.join(names) or 'none'}); deploy one with playbooks/pool.yml, or pass its spec with --pool SPEC"
        )
    lt = _template(groups[0])
    ref = {"LaunchTemplateId": lt["LaunchTemplateId"]} if "LaunchTemplateId" in lt else {
        "LaunchTemplateName": lt.get("LaunchTemplateName", "")}  # fmt: skip
    version = str(lt.get("Version") or "$Default")
    with aws_errors(f"read the launch template of pool {pool}"):
        got = ec2.describe_launch_template_versions(**ref, Versions=[version])["LaunchTemplateVersions"]
    data = got[0].get("LaunchTemplateData", {}) if got else {}
    text = base64.b64decode(data.get("UserData", "")).decode("utf-8", "replace")
    spec = spec_of_user_data(text, f"pool {pool}'s launch template")
    if spec.pool not in (None, pool):
        raise UsageError(f"pool {pool}'s launch template carries the spec of pool {spec.pool}: refusing it")
    return spec
