"""A session-host class's hosts' IAM role, inline policy and instance profile as one operation, present or absent.

The documents are ``calque.aws.fleet_iam``'s (what ``calque.gpu.session_fleet_iam_policy`` returns), for the
account of the credentials in use; ``calque.aws.worker_role`` makes the role match them or removes it, as
it does a pool's workers' role (``worker_role_op.py``: the steps both share). One module run in the
``calque.gpu.session_fleet`` role instead of an account lookup, a role, a policy and a profile task each.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from calque.aws.fleet_iam import FleetIamDocuments, fleet_iam_documents
from calque.aws.worker_role import WorkerRole
from calque.errors import UsageError
from calque.models.base import CalqueModel
from calque.models.fleet import ClassName, MungeKeySource
from calque.ops.base import validated
from calque.ops.worker_role_op import WorkerRoleOp


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


class FleetRoleOp(WorkerRoleOp[FleetRoleRequest, FleetRoleResult]):
    name = "session_fleet_iam"
    Request = FleetRoleRequest

    def role_for(self, request: FleetRoleRequest, region: str, account: str) -> tuple[FleetIamDocuments, WorkerRole]:
        if request.state == "present" and request.munge_key is None:
            raise UsageError("munge_key is required with state=present: the hosts' policy reads the key from it")
        key = None if request.munge_key is None else validated(MungeKeySource, request.munge_key, "invalid munge_key")
        docs = fleet_iam_documents(request.fleet_class, key, region=region, account=account, bucket=request.bucket)
        role = WorkerRole(
            self.aws.client("iam"),
            docs,
            pool=docs.pool,
            policy=docs.host_policy,
            description=f"calque session class {request.fleet_class}: its hosts (munge key, registration, own group)",
        )
        return docs, role

    def result_for(self, documents: FleetIamDocuments, profile_exists: bool) -> FleetRoleResult:
        return FleetRoleResult(**documents.model_dump(), profile_exists=profile_exists)
