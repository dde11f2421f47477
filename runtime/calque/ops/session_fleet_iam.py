"""A session-host class's hosts' IAM role, inline policy and instance profile as one operation, present or absent.

The documents are ``calque.aws.fleet_iam``'s (what ``calque.gpu.session_fleet_iam_policy`` returns), for the
account of the credentials in use; ``calque.aws.worker_role`` makes the role match them or removes it, as
it does a pool's workers' role. One module run in the ``calque.gpu.session_fleet`` role instead of an
account lookup, a role, a policy and a profile task each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from calque.aws.errors import aws_errors
from calque.aws.fleet_iam import FleetIamDocuments, fleet_iam_documents
from calque.aws.worker_role import RoleChange, WorkerRole
from calque.errors import RefusedError, UsageError
from calque.models.base import CalqueModel
from calque.models.fleet import ClassName, MungeKeySource
from calque.models.pool_names import ForeignPoolError
from calque.ops.base import Operation, validated
from calque.ops.outcome import Outcome


class FleetRoleRequest(CalqueModel):
    fleet_class: ClassName
    munge_key: dict[str, Any] | None = Field(
        None, description="ssm_parameter, or s3_bucket and s3_key (and kms_key_arn); required for present"
    )
    bucket: str = Field(description="the bucket the class's runtime is staged in")
    state: Literal["present", "absent"] = "present"


class FleetRoleResult(FleetIamDocuments):
    """The class's IAM names and documents, and whether its instance profile exists after the run."""

    profile_exists: bool = Field(description="False in check mode when the run would create it, and after absent")


@dataclass
class FleetRolePlan:
    documents: FleetIamDocuments
    role: WorkerRole
    state: str
    change: RoleChange


class FleetRoleOp(Operation[FleetRoleRequest, FleetRolePlan, FleetRoleResult]):
    name = "session_fleet_iam"
    Request = FleetRoleRequest

    def plan(self, request: FleetRoleRequest) -> FleetRolePlan:
        region = self.aws.region
        if not region:
            raise UsageError("no AWS region: give region (or calque_aws_region through module_defaults)")
        if request.state == "present" and request.munge_key is None:
            raise UsageError("munge_key is required with state=present: the hosts' policy reads the key from it")
        key = None if request.munge_key is None else validated(MungeKeySource, request.munge_key, "invalid munge_key")
        with aws_errors("find the AWS account of these credentials (sts:GetCallerIdentity)"):
            account = str(self.aws.client("sts").get_caller_identity()["Account"])
        docs = fleet_iam_documents(request.fleet_class, key, region=region, account=account, bucket=request.bucket)
        role = WorkerRole(
            self.aws.client("iam"),
            pool=docs.pool,
            role_name=docs.role_name,
            profile_name=docs.instance_profile_name,
            policy_name=docs.policy_name,
            trust=docs.trust_policy,
            policy=docs.host_policy,
            tags=docs.tags,
            description=f"calque session class {request.fleet_class}: its hosts (munge key, registration, own group)",
        )
        try:
            change = role.remove(check_mode=True) if request.state == "absent" else role.ensure(check_mode=True)
        except ForeignPoolError as exc:  # another pool's or class's role: neither adopted nor deleted
            raise RefusedError(str(exc)) from None
        return FleetRolePlan(docs, role, request.state, change)

    def check(self, plan: FleetRolePlan) -> Outcome[FleetRoleResult]:
        return self._outcome(plan, plan.change, check_mode=True)

    def apply(self, plan: FleetRolePlan) -> Outcome[FleetRoleResult]:
        if not plan.change.changed:
            return self._outcome(plan, plan.change, check_mode=False)
        change = plan.role.remove() if plan.state == "absent" else plan.role.ensure()
        return self._outcome(plan, change, check_mode=False)

    def _outcome(self, plan: FleetRolePlan, change: RoleChange, *, check_mode: bool) -> Outcome[FleetRoleResult]:
        return Outcome[FleetRoleResult](
            resource=self.name,
            check_mode=check_mode,
            changed=change.changed,
            before=change.before.model_dump(mode="json"),
            after=change.after.model_dump(mode="json"),
            actions=change.actions,
            result=FleetRoleResult(
                **plan.documents.model_dump(), profile_exists=change.after.instance_profile_arn is not None
            ),
        )
