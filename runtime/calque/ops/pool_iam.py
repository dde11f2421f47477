"""A pool's workers' IAM role, inline policy and instance profile as one operation, present or absent.

The documents are ``calque.aws.iam_policy``'s (the same ``calque pool iam-policy`` prints), rendered for
the account the credentials belong to; ``calque.aws.worker_role`` makes the role match them or removes
it (``worker_role_op.py``: the steps both role operations share). One operation instead of an account
lookup, a role, a policy and a profile task each: one module run for ``pool.yml`` and ``teardown.yml``,
and one place that refuses another pool's role.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from calque.aws.iam_policy import PoolIamDocuments, pool_iam_documents
from calque.aws.worker_role import WorkerRole
from calque.models.base import CalqueModel, PoolName
from calque.ops.worker_role_op import WorkerRoleOp


class PoolRoleRequest(CalqueModel):
    pool: PoolName
    bucket: str = Field(description="the pool's S3 bucket")
    prefix: str = Field("calque", description="key prefix of the pool's objects in the bucket (the spec's prefix)")
    state: Literal["present", "absent"] = "present"


class PoolRoleResult(PoolIamDocuments):
    """The pool's IAM names and documents, and whether its instance profile exists after the run."""

    profile_exists: bool = Field(description="False in check mode when the run would create it, and after absent")


class PoolRoleOp(WorkerRoleOp[PoolRoleRequest, PoolRoleResult]):
    name = "pool_iam"
    Request = PoolRoleRequest

    def role_for(self, request: PoolRoleRequest, region: str, account: str) -> tuple[PoolIamDocuments, WorkerRole]:
        docs = pool_iam_documents(
            request.pool, bucket=request.bucket, region=region, account=account, prefix=request.prefix
        )
        role = WorkerRole(
            self.aws.client("iam"),
            docs,
            pool=request.pool,
            policy=docs.worker_policy,
            description=f"calque pool {request.pool}: its workers (own queue, own keys, own group)",
        )
        return docs, role

    def result_for(self, documents: PoolIamDocuments, profile_exists: bool) -> PoolRoleResult:
        return PoolRoleResult(**documents.model_dump(), profile_exists=profile_exists)
