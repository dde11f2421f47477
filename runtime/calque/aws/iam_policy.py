"""The IAM documents of one pool, rendered from its name: the workers' role and the controller's policy.

A pool's workers run under one role per pool (``pool_names(pool).role``), reached through an instance
profile of the same name. Its inline policy grants what a worker calls and nothing else:

- its own queue only (``pool_names(pool).queue``): receive, delete, change visibility, read the
  attributes and the URL, and send (a graceful release re-sends its claim to the same queue);
- its own objects only, ``s3://BUCKET/<pool_key_base>/*``: get, put and delete (a worker deletes the
  results object of an attempt that lost its lease), plus ``s3:ListBucket`` limited by ``s3:prefix``
  to that same prefix, because without it S3 answers 403 instead of 404 for a missing object and a
  worker asks "does this claim's Summary exist" before every claim;
- its own Auto Scaling group only: scale-in protection and the lifecycle action, for a group that is
  both named for the pool and tagged ``calque:pool=<pool>``; and ``DescribeAutoScalingInstances``
  (read-only, which AWS cannot scope to a resource), by which a worker finds its instance's group.

``controller_policy`` is what a person running ``playbooks/pool.yml`` for that pool needs (bucket,
queues, role and instance profile, ``iam:PassRole`` for that role alone, launch template, group,
alarms, the describes that AWS cannot scope). ``docs/pool.md`` shows both, generated from here, and a
test checks the doc is current. Everything is a pure function: no AWS call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from calque.aws.naming import pool_key_base
from calque.errors import UsageError
from calque.models.base import CalqueModel
from calque.models.pool_names import POOL_TAG, pool_names

POLICY_VERSION = "2012-10-17"

WORKER_QUEUE_ACTIONS = (
    "sqs:ChangeMessageVisibility",
    "sqs:DeleteMessage",
    "sqs:GetQueueAttributes",
    "sqs:GetQueueUrl",
    "sqs:ReceiveMessage",
    "sqs:SendMessage",
)
WORKER_OBJECT_ACTIONS = ("s3:DeleteObject", "s3:GetObject", "s3:PutObject")
# SetInstanceProtection while a claim is held; CompleteLifecycleAction after a termination hook's @exit.
WORKER_GROUP_ACTIONS = ("autoscaling:CompleteLifecycleAction", "autoscaling:SetInstanceProtection")
# a worker finds its instance's group by asking, and reads its budget hold (calque.pool.worker.instance);
# AWS scopes no Describe call
WORKER_UNSCOPED_READS = ("autoscaling:DescribeAutoScalingInstances", "autoscaling:DescribeAutoScalingGroups")

_ACCOUNT = re.compile(r"\d{12}")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")
# S3's rule for new buckets: 3-63 of a-z 0-9 . -, starting and ending with a letter or digit
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def partition(region: str) -> str:
    """The ARN partition of ``region``: ``aws``, ``aws-cn`` or ``aws-us-gov``."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def _ec2_principal(region: str) -> str:
    return "ec2.amazonaws.com.cn" if partition(region) == "aws-cn" else "ec2.amazonaws.com"


@dataclass(frozen=True)
class PoolArns:
    """The ARNs (and the S3 key base) of one pool's resources in one account and region."""

    pool: str
    region: str
    account: str
    bucket_name: str
    key_base: str  # every object of the pool lives under <key_base>/
    queue: str
    dlq: str
    bucket: str
    objects: str  # arn:...:s3:::BUCKET/<key_base>/*
    prefix_objects: str  # arn:...:s3:::BUCKET/<prefix>/*: the controller also stages the runtime there
    group: str
    launch_templates: str
    role: str
    instance_profile: str
    alarms: str


def pool_arns(pool: str, *, bucket: str, region: str, account: str, prefix: str = "calque") -> PoolArns:
    """The ARNs of ``pool``'s resources; UsageError naming the input to fix when one is malformed."""
    try:
        names = pool_names(pool)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not _ACCOUNT.fullmatch(account or ""):
        raise UsageError(
            f"account {account!r} is not an AWS account id: give its 12 digits (aws sts get-caller-identity)"
        )
    if not _REGION.fullmatch(region or ""):
        raise UsageError(f"region {region!r} is not an AWS region name such as us-east-1")
    if not _BUCKET.fullmatch(bucket or "") or ".." in bucket:
        raise UsageError(
            f"bucket {bucket!r} is not an S3 bucket name: 3-63 of a-z 0-9 . -, starting with a letter or digit"
        )
    segments = [s for s in prefix.strip("/").split("/") if s]
    if any(not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", s) or ".." in s for s in segments):
        raise UsageError(f"prefix {prefix!r}: each segment must be letters, digits, '.', '_' or '-' (e.g. calque)")
    part = partition(region)
    key_base = pool_key_base(prefix, names.queue)
    top = "/".join(segments)
    return PoolArns(
        pool=pool,
        region=region,
        account=account,
        bucket_name=bucket,
        key_base=key_base,
        queue=f"arn:{part}:sqs:{region}:{account}:{names.queue}",
        dlq=f"arn:{part}:sqs:{region}:{account}:{names.dlq}",
        bucket=f"arn:{part}:s3:::{bucket}",
        objects=f"arn:{part}:s3:::{bucket}/{key_base}/*",
        prefix_objects=f"arn:{part}:s3:::{bucket}/{top}/*" if top else f"arn:{part}:s3:::{bucket}/*",
        group=f"arn:{part}:autoscaling:{region}:{account}:autoScalingGroup:*:autoScalingGroupName/{names.group}",
        launch_templates=f"arn:{part}:ec2:{region}:{account}:launch-template/*",
        role=f"arn:{part}:iam::{account}:role/{names.role}",
        instance_profile=f"arn:{part}:iam::{account}:instance-profile/{names.instance_profile}",
        alarms=f"arn:{part}:cloudwatch:{region}:{account}:alarm:{names.base}*",
    )


def _statement(
    sid: str, actions: tuple[str, ...] | list[str], resource: str | list[str], **condition: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {"Sid": sid, "Effect": "Allow", "Action": sorted(actions), "Resource": resource}
    if condition:
        out["Condition"] = condition
    return out


def worker_trust_policy(region: str = "us-east-1") -> dict[str, Any]:
    """Who may assume the workers' role: EC2, for the pool's instances (through the instance profile)."""
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {
                "Sid": "PoolInstances",
                "Effect": "Allow",
                "Principal": {"Service": _ec2_principal(region)},
                "Action": "sts:AssumeRole",
            }
        ],
    }


def worker_policy(arns: PoolArns) -> dict[str, Any]:
    """The workers' inline policy: this pool's queue, objects and group, nothing else."""
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            _statement("PoolQueue", WORKER_QUEUE_ACTIONS, arns.queue),
            _statement("PoolObjects", WORKER_OBJECT_ACTIONS, arns.objects),
            # a missing key is 404 (not 403) only for a caller that may list it; S3 checks that
            # with the key as s3:prefix, so the listing is limited to the pool's own keys
            _statement(
                "PoolKeysOnly", ("s3:ListBucket",), arns.bucket, StringLike={"s3:prefix": [f"{arns.key_base}/*"]}
            ),
            _statement(
                "PoolGroupOnly",
                WORKER_GROUP_ACTIONS,
                arns.group,
                StringEquals={f"autoscaling:ResourceTag/{POOL_TAG}": arns.pool},
            ),
            _statement("FindOwnGroup", WORKER_UNSCOPED_READS, "*"),
        ],
    }


def controller_policy(arns: PoolArns) -> dict[str, Any]:
    """What running ``playbooks/pool.yml`` (and its teardown) for this pool needs, scoped to the pool."""
    tag = {f"aws:RequestTag/{POOL_TAG}": arns.pool}
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            _statement(
                "PoolBucket",
                (
                    "s3:CreateBucket",
                    "s3:DeleteBucket",
                    "s3:GetBucket*",
                    "s3:GetEncryptionConfiguration",
                    "s3:ListBucket",
                    "s3:PutBucketOwnershipControls",
                    "s3:PutBucketPublicAccessBlock",
                    "s3:PutBucketTagging",
                    "s3:PutEncryptionConfiguration",
                ),
                arns.bucket,
            ),
            # the workload under the pool's keys and the runtime wheel under <prefix>/runtime/
            _statement("PoolObjects", ("s3:DeleteObject", "s3:GetObject", "s3:PutObject"), arns.prefix_objects),
            _statement(
                "PoolQueues",
                (
                    "sqs:CreateQueue",
                    "sqs:DeleteQueue",
                    "sqs:GetQueueAttributes",
                    "sqs:GetQueueUrl",
                    "sqs:ListQueueTags",
                    "sqs:SetQueueAttributes",
                    "sqs:TagQueue",
                    "sqs:UntagQueue",
                ),
                [arns.queue, arns.dlq],
            ),
            _statement(
                "WorkerRole",
                (
                    "iam:CreateRole",
                    "iam:DeleteRole",
                    "iam:DeleteRolePolicy",
                    "iam:DetachRolePolicy",
                    "iam:GetRole",
                    "iam:GetRolePolicy",
                    "iam:ListAttachedRolePolicies",
                    "iam:ListInstanceProfilesForRole",
                    "iam:ListRolePolicies",
                    "iam:ListRoleTags",
                    "iam:PutRolePolicy",
                    "iam:TagRole",
                    "iam:UntagRole",
                    "iam:UpdateAssumeRolePolicy",
                    "iam:UpdateRole",
                ),
                arns.role,
            ),
            _statement(
                "WorkerInstanceProfile",
                (
                    "iam:AddRoleToInstanceProfile",
                    "iam:CreateInstanceProfile",
                    "iam:DeleteInstanceProfile",
                    "iam:GetInstanceProfile",
                    "iam:ListInstanceProfileTags",
                    "iam:RemoveRoleFromInstanceProfile",
                    "iam:TagInstanceProfile",
                    "iam:UntagInstanceProfile",
                ),
                arns.instance_profile,
            ),
            _statement("PassWorkerRoleOnly", ("iam:PassRole",), arns.role),
            _statement(
                "CreatePoolLaunchTemplate",
                ("ec2:CreateLaunchTemplate", "ec2:CreateTags"),
                arns.launch_templates,
                StringEquals=tag,
            ),
            _statement(
                "PoolLaunchTemplate",
                (
                    "ec2:CreateLaunchTemplateVersion",
                    "ec2:DeleteLaunchTemplate",
                    "ec2:DeleteLaunchTemplateVersions",
                    "ec2:ModifyLaunchTemplate",
                ),
                arns.launch_templates,
                StringEquals={f"aws:ResourceTag/{POOL_TAG}": arns.pool},
            ),
            # a group that launches from a template needs its creator allowed to launch from it
            # (the check-mode DryRun launch too); only from a launch template, never bare
            _statement(
                "LaunchFromTemplateOnly",
                ("ec2:CreateTags", "ec2:RunInstances"),
                "*",
                ArnLike={"ec2:LaunchTemplate": arns.launch_templates},
            ),
            _statement("CreatePoolGroup", ("autoscaling:CreateAutoScalingGroup",), arns.group, StringEquals=tag),
            _statement(
                "PoolGroup",
                (
                    "autoscaling:CancelInstanceRefresh",
                    "autoscaling:CreateOrUpdateTags",
                    "autoscaling:DeleteAutoScalingGroup",
                    "autoscaling:DeleteLifecycleHook",
                    "autoscaling:DeletePolicy",
                    "autoscaling:DeleteTags",
                    "autoscaling:EnableMetricsCollection",
                    "autoscaling:PutLifecycleHook",
                    "autoscaling:PutScalingPolicy",
                    "autoscaling:SetDesiredCapacity",
                    "autoscaling:SetInstanceHealth",
                    "autoscaling:StartInstanceRefresh",
                    "autoscaling:TerminateInstanceInAutoScalingGroup",
                    "autoscaling:UpdateAutoScalingGroup",
                ),
                arns.group,
                StringEquals={f"autoscaling:ResourceTag/{POOL_TAG}": arns.pool},
            ),
            _statement(
                "PoolAlarms",
                (
                    "cloudwatch:DeleteAlarms",
                    "cloudwatch:ListTagsForResource",
                    "cloudwatch:PutMetricAlarm",
                    "cloudwatch:TagResource",
                ),
                arns.alarms,
            ),
            _statement(
                "AutoScalingServiceRole",
                ("iam:CreateServiceLinkedRole",),
                f"arn:{partition(arns.region)}:iam::{arns.account}:role/aws-service-role/"
                "autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling",
                StringEquals={"iam:AWSServiceName": "autoscaling.amazonaws.com"},
            ),
            _statement(
                "PublicAmiParameters",
                ("ssm:GetParameter", "ssm:GetParameters"),
                f"arn:{partition(arns.region)}:ssm:{arns.region}::parameter/aws/service/*",
            ),
            # reads AWS does not scope to a resource
            _statement(
                "ReadOnlyUnscoped",
                (
                    "autoscaling:Describe*",
                    "cloudwatch:DescribeAlarms",
                    "cloudwatch:GetMetricData",
                    "ec2:Describe*",
                    "sts:GetCallerIdentity",
                ),
                "*",
            ),
        ],
    }


class PoolIamDocuments(CalqueModel):
    """Every IAM name and document of one pool: what ``calque.gpu.pool_iam_policy`` returns."""

    pool: str
    account: str
    region: str
    bucket: str
    key_base: str = Field(description="the S3 key prefix every object of the pool lives under")
    role_name: str
    role_arn: str
    instance_profile_name: str
    instance_profile_arn: str
    policy_name: str
    tags: dict[str, str]
    trust_policy: dict[str, Any]
    worker_policy: dict[str, Any]
    controller_policy: dict[str, Any]


def pool_iam_documents(
    pool: str, *, bucket: str, region: str, account: str, prefix: str = "calque"
) -> PoolIamDocuments:
    """The role, instance profile and policy names of ``pool`` with every document they carry."""
    arns = pool_arns(pool, bucket=bucket, region=region, account=account, prefix=prefix)
    names = pool_names(pool)
    return PoolIamDocuments(
        pool=pool,
        account=account,
        region=region,
        bucket=bucket,
        key_base=arns.key_base,
        role_name=names.role,
        role_arn=arns.role,
        instance_profile_name=names.instance_profile,
        instance_profile_arn=arns.instance_profile,
        policy_name=names.policy,
        tags=names.tags,
        trust_policy=worker_trust_policy(region),
        worker_policy=worker_policy(arns),
        controller_policy=controller_policy(arns),
    )
