"""A pool's IAM documents as an operation that never changes anything (``calque.aws.iam_policy``).

``calque.gpu.pool_iam_policy`` returns them and ``calque pool iam-policy`` prints them;
``calque.ops.pool_iam`` makes the role from the same documents.
"""

from __future__ import annotations

from pydantic import Field

from calque.aws.iam_policy import PoolIamDocuments, pool_iam_documents
from calque.models.base import CalqueModel, PoolName
from calque.ops.base import Operation
from calque.ops.outcome import Outcome


class PoolIamRequest(CalqueModel):
    pool: PoolName
    bucket: str = Field(description="the pool's S3 bucket")
    region: str = Field(description="the pool's AWS region")
    account: str = Field(description="the AWS account id (12 digits)")
    prefix: str = Field("calque", description="key prefix of the pool's objects in the bucket (the spec's prefix)")


class PoolIamOp(Operation[PoolIamRequest, PoolIamDocuments, PoolIamDocuments]):
    name = "pool_iam_policy"
    Request = PoolIamRequest

    def plan(self, request: PoolIamRequest) -> PoolIamDocuments:
        return pool_iam_documents(
            request.pool, bucket=request.bucket, region=request.region, account=request.account, prefix=request.prefix
        )

    def check(self, plan: PoolIamDocuments) -> Outcome[PoolIamDocuments]:
        return Outcome[PoolIamDocuments](resource=self.name, check_mode=True, changed=False, result=plan)

    def apply(self, plan: PoolIamDocuments) -> Outcome[PoolIamDocuments]:
        return Outcome[PoolIamDocuments](resource=self.name, changed=False, result=plan)
