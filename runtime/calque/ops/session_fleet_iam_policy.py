"""A session-host class's IAM documents as an operation that never changes anything (``calque.aws.fleet_iam``).

``calque.gpu.session_fleet_iam_policy`` returns them to the ``calque.gpu.session_fleet`` role, which
hands them to amazon.aws's ``iam_role``, ``iam_policy`` and ``iam_instance_profile``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from calque.aws.fleet_iam import FleetIamDocuments, fleet_iam_documents
from calque.models.base import CalqueModel
from calque.models.fleet import ClassName, MungeKeySource
from calque.ops.base import Operation, validated
from calque.ops.outcome import Outcome


class FleetIamRequest(CalqueModel):
    fleet_class: ClassName
    munge_key: dict[str, Any] | None = Field(
        None, description="ssm_parameter, or s3_bucket and s3_key (and kms_key_arn); None: names only (teardown)"
    )
    bucket: str = Field(description="the bucket the class's runtime is staged in")
    region: str
    account: str = Field(description="the AWS account id (12 digits)")


class FleetIamOp(Operation[FleetIamRequest, FleetIamDocuments, FleetIamDocuments]):
    name = "session_fleet_iam_policy"
    Request = FleetIamRequest

    def plan(self, request: FleetIamRequest) -> FleetIamDocuments:
        key = None if request.munge_key is None else validated(MungeKeySource, request.munge_key, "invalid munge_key")
        return fleet_iam_documents(
            request.fleet_class, key, region=request.region, account=request.account, bucket=request.bucket
        )

    def check(self, plan: FleetIamDocuments) -> Outcome[FleetIamDocuments]:
        return Outcome[FleetIamDocuments](resource=self.name, check_mode=True, changed=False, result=plan)

    def apply(self, plan: FleetIamDocuments) -> Outcome[FleetIamDocuments]:
        return Outcome[FleetIamDocuments](resource=self.name, changed=False, result=plan)
