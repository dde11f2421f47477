"""The IAM documents of one session-host class, rendered from its name: its hosts' role and the broker's policy.

A class's hosts run under one role (``pool_names(fleet_pool(class)).role``) through an instance profile
of the same name. Its inline policy grants what a booting and serving host calls, nothing else:

- the institution's munge key, at the one place inventory names: ``ssm:GetParameter`` on that
  SecureString, or ``s3:GetObject`` on that object; and ``kms:Decrypt`` of its KMS key when one is
  named, only through that service (``kms:ViaService``). No other secret, no other object;
- its own registration: ``ssm:PutParameter``/``ssm:DeleteParameter`` under
  ``/calque/session-fleet/<class>/hosts/`` (the broker reads it to reach the host);
- its own group only (named for the class's pool and tagged ``calque:pool``): scale-in protection
  while a session is live, and the drain's lifecycle action (heartbeat, complete); and
  ``DescribeAutoScalingInstances`` (read-only; AWS scopes no Describe call), by which it finds its group.

The runtime comes through a presigned URL (no permission). ``broker_policy`` is what the broker's
credentials need to publish the classes' demand (``PutMetricData``, only into ``calque/session``) and
find their hosts (``GetParametersByPath`` under the classes' registration paths). Pure functions.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from calque.aws.iam_policy import (
    POLICY_VERSION,
    WORKER_UNSCOPED_READS,
    _statement,
    partition,
    pool_arns,
    worker_trust_policy,
)
from calque.models.base import CalqueModel
from calque.models.fleet import DEMAND_NAMESPACE, FLEET_TAG, MungeKeySource, fleet_pool, registration_path
from calque.models.pool_names import POOL_TAG, pool_names

HOST_GROUP_ACTIONS = (
    "autoscaling:CompleteLifecycleAction",
    "autoscaling:RecordLifecycleActionHeartbeat",
    "autoscaling:SetInstanceProtection",
)
HOST_REGISTRATION_ACTIONS = ("ssm:DeleteParameter", "ssm:PutParameter")


class FleetIamDocuments(CalqueModel):
    """A class's IAM names and documents, for amazon.aws's iam_role, iam_policy and iam_instance_profile."""

    fleet_class: str
    pool: str
    role_name: str
    instance_profile_name: str
    policy_name: str
    trust_policy: dict[str, Any]
    host_policy: dict[str, Any]
    broker_policy: dict[str, Any]
    tags: dict[str, str] = Field(default_factory=dict)


def host_policy(
    fleet_class: str, key: MungeKeySource | None, *, region: str, account: str, bucket: str
) -> dict[str, Any]:
    """The class's hosts' inline policy: the munge key, their registration, their group, nothing else."""
    pool = fleet_pool(fleet_class)
    arns = pool_arns(pool, bucket=bucket, region=region, account=account)
    part = partition(region)
    statements: list[dict[str, Any]] = []
    via = ""
    if key is None:  # names only (a teardown): a policy that reads no key
        pass
    elif key.ssm_parameter is not None:
        statements.append(
            _statement(
                "MungeKeyOnly", ("ssm:GetParameter",), f"arn:{part}:ssm:{region}:{account}:parameter{key.ssm_parameter}"
            )
        )
        via = f"ssm.{region}.amazonaws.com"
    else:
        statements.append(
            _statement("MungeKeyOnly", ("s3:GetObject",), f"arn:{part}:s3:::{key.s3_bucket}/{key.s3_key}")
        )
        via = f"s3.{region}.amazonaws.com"
    if key is not None and key.kms_key_arn:
        statements.append(
            _statement("MungeKeyDecrypt", ("kms:Decrypt",), key.kms_key_arn, StringEquals={"kms:ViaService": via})
        )
    statements += [
        _statement(
            "OwnRegistration",
            HOST_REGISTRATION_ACTIONS,
            f"arn:{part}:ssm:{region}:{account}:parameter{registration_path(fleet_class)}/*",
        ),
        _statement(
            "ClassGroupOnly",
            HOST_GROUP_ACTIONS,
            arns.group,
            StringEquals={f"autoscaling:ResourceTag/{POOL_TAG}": pool},
        ),
        _statement("FindOwnGroup", WORKER_UNSCOPED_READS, "*"),
    ]
    return {"Version": POLICY_VERSION, "Statement": statements}


def broker_policy(classes: list[str], *, region: str, account: str) -> dict[str, Any]:
    """What the broker's credentials need for these classes: publish demand, read registrations."""
    part = partition(region)
    paths = [f"arn:{part}:ssm:{region}:{account}:parameter{registration_path(c)}" for c in sorted(classes)]
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            _statement(
                "DemandMetricOnly",
                ("cloudwatch:PutMetricData",),
                "*",  # PutMetricData has no resource; the namespace is its condition
                StringEquals={"cloudwatch:namespace": DEMAND_NAMESPACE},
            ),
            _statement("FindClassHosts", ("ssm:GetParametersByPath",), paths),
        ],
    }


def fleet_iam_documents(
    fleet_class: str, key: MungeKeySource | None, *, region: str, account: str, bucket: str
) -> FleetIamDocuments:
    """Every IAM name and document of class ``fleet_class``."""
    pool = fleet_pool(fleet_class)
    names = pool_names(pool)
    return FleetIamDocuments(
        fleet_class=fleet_class,
        pool=pool,
        role_name=names.role,
        instance_profile_name=names.instance_profile,
        policy_name=names.policy,
        trust_policy=worker_trust_policy(region),
        host_policy=host_policy(fleet_class, key, region=region, account=account, bucket=bucket),
        broker_policy=broker_policy([fleet_class], region=region, account=account),
        tags={**names.tags, FLEET_TAG: fleet_class},
    )
