"""A pool's workers' IAM role, inline policy and instance profile as one operation, present or absent.

The documents are ``calque.aws.iam_policy``'s (the same ``calque pool iam-policy`` prints), rendered for
the account the credentials belong to; ``calque.aws.worker_role`` makes the role match them or removes
it. One operation instead of an account lookup, a role, a policy and a profile task each: one module
run for ``pool.yml`` and ``teardown.yml``, and one place that refuses another pool's role.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from calque.aws.errors import aws_errors
from calque.aws.iam_policy import PoolIamDocuments, pool_iam_documents
from calque.aws.worker_role import RoleChange, WorkerRole
from calque.errors import RefusedError, UsageError
from calque.models.base import CalqueModel, PoolName
from calque.models.pool_names import ForeignPoolError
from calque.ops.base import Operation
from calque.ops.outcome import Outcome


class PoolRoleRequest(CalqueModel):
    pool: PoolName
    bucket: str = Field(description="the pool's S3 bucket")
    prefix: str = Field("calque", description="key prefix of the pool's objects in the bucket (the spec's prefix)")
    state: Literal["present", "absent"] = "present"


class PoolRoleResult(PoolIamDocuments):
    """The pool's IAM names and documents, and whether its instance profile exists after the run."""

    profile_exists: bool = Field(description="False in check mode when the run would create it, and after absent")


@dataclass
class PoolRolePlan:
    request: PoolRoleRequest
    documents: PoolIamDocuments
    role: WorkerRole
    change: RoleChange  # computed in check mode: the predicted after


class PoolRoleOp(Operation[PoolRoleRequest, PoolRolePlan, PoolRoleResult]):
    name = "pool_iam"
    Request = PoolRoleRequest

    def plan(self, request: PoolRoleRequest) -> PoolRolePlan:
        region = self.aws.region
        if not region:
            raise UsageError("no AWS region: give region (or calque_aws_region through module_defaults)")
        with aws_errors("find the AWS account of these credentials (sts:GetCallerIdentity)"):
            account = str(self.aws.client("sts").get_caller_identity()["Account"])
        docs = pool_iam_documents(
            request.pool, bucket=request.bucket, region=region, account=account, prefix=request.prefix
        )
        role = WorkerRole(
            self.aws.client("iam"),
            pool=request.pool,
            role_name=docs.role_name,
            profile_name=docs.instance_profile_name,
            policy_name=docs.policy_name,
            trust=docs.trust_policy,
            policy=docs.worker_policy,
            tags=docs.tags,
            description=f"calque pool {request.pool}: its workers (own queue, own keys, own group)",
        )
        try:
            change = role.remove(check_mode=True) if request.state == "absent" else role.ensure(check_mode=True)
        except ForeignPoolError as exc:  # another pool's role: neither adopted nor deleted
            raise RefusedError(str(exc)) from None
        return PoolRolePlan(request, docs, role, change)

    def check(self, plan: PoolRolePlan) -> Outcome[PoolRoleResult]:
        return self._outcome(plan, plan.change, check_mode=True)

    def apply(self, plan: PoolRolePlan) -> Outcome[PoolRoleResult]:
        if not plan.change.changed:
            return self._outcome(plan, plan.change, check_mode=False)
        absent = plan.request.state == "absent"
        change = plan.role.remove() if absent else plan.role.ensure()
        return self._outcome(plan, change, check_mode=False)

    def _outcome(self, plan: PoolRolePlan, change: RoleChange, *, check_mode: bool) -> Outcome[PoolRoleResult]:
        return Outcome[PoolRoleResult](
            resource=self.name,
            check_mode=check_mode,
            changed=change.changed,
            before=change.before.model_dump(mode="json"),
            after=change.after.model_dump(mode="json"),
            actions=change.actions,
            result=PoolRoleResult(
                **plan.documents.model_dump(), profile_exists=change.after.instance_profile_arn is not None
            ),
        )
