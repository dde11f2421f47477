"""What the two role operations share (``pool_iam``, ``session_fleet_iam``): the account of the credentials
in use, the role's plan in check mode, the apply, and the Outcome with the documents and ``profile_exists``.

Each operation says only which documents its role is made from (``role_for``) and how its result carries
them (``result_for``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from calque.aws.aws_errors import aws_errors
from calque.aws.worker_role import RoleChange, WorkerRole
from calque.errors import RefusedError, UsageError
from calque.models.base import CalqueModel
from calque.models.pool_names import ForeignPoolError
from calque.ops.base import Operation
from calque.ops.outcome import Outcome

Req = TypeVar("Req", bound=CalqueModel)
Res = TypeVar("Res", bound=BaseModel)


@dataclass
class RolePlan:
    documents: Any  # the operation's documents model (PoolIamDocuments, FleetIamDocuments)
    role: WorkerRole
    absent: bool
    change: RoleChange  # computed in check mode: the predicted after


class WorkerRoleOp(Operation[Req, RolePlan, Res], Generic[Req, Res]):
    def role_for(self, request: Req, region: str, account: str) -> tuple[Any, WorkerRole]:
        raise NotImplementedError

    def result_for(self, documents: Any, profile_exists: bool) -> Res:
        raise NotImplementedError

    def plan(self, request: Req) -> RolePlan:
        region = self.aws.region
        if not region:
            raise UsageError("no AWS region: give region (or calque_aws_region through module_defaults)")
        with aws_errors("find the AWS account of these credentials (sts:GetCallerIdentity)"):
            account = str(self.aws.client("sts").get_caller_identity()["Account"])
        documents, role = self.role_for(request, region, account)
        absent = getattr(request, "state", "present") == "absent"
        try:
            change = role.remove(check_mode=True) if absent else role.ensure(check_mode=True)
        except ForeignPoolError as exc:  # another pool's (or class's) role: neither adopted nor deleted
            raise RefusedError(str(exc)) from None
        return RolePlan(documents, role, absent, change)

    def check(self, plan: RolePlan) -> Outcome[Res]:
        return self._outcome(plan, plan.change, check_mode=True)

    def apply(self, plan: RolePlan) -> Outcome[Res]:
        if not plan.change.changed:
            return self._outcome(plan, plan.change, check_mode=False)
        change = plan.role.remove() if plan.absent else plan.role.ensure()
        return self._outcome(plan, change, check_mode=False)

    def _outcome(self, plan: RolePlan, change: RoleChange, *, check_mode: bool) -> Outcome[Res]:
        return Outcome[Any](
            resource=self.name,
            check_mode=check_mode,
            changed=change.changed,
            before=change.before.model_dump(mode="json"),
            after=change.after.model_dump(mode="json"),
            actions=change.actions,
            result=self.result_for(plan.documents, change.after.instance_profile_arn is not None),
        )
