"""A session-host class's user-data as an operation: the runtime staged, the script rendered.

The class's spec is a ``SessionHostSpec``; its session config is checked as the daemon will read it
(``SessionConfig``, without the host's own name and listener, which the host adds at boot) and its
institution as ``Institution``. The runtime is staged as a pool's is (``RuntimeOp``: this controller's
wheel and wheelhouse in the bucket, presigned for ``runtime_ttl``; an identical one is not uploaded
again), or named (``runtime_pip``). Check mode stages nothing; its user-data is the real run's, so the
launch template's config digest is the one the real run launches with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from calque.errors import UsageError
from calque.models.base import CalqueModel
from calque.models.fleet import SessionHostSpec
from calque.models.institution import Institution
from calque.ops.base import Operation, validated
from calque.ops.outcome import Outcome
from calque.ops.runtime import RuntimeOp, RuntimePlan, RuntimeRequest, RuntimeResult
from calque.session.session_config import SessionConfig

_UNBUILT = "0" * 64  # check mode before the first wheelhouse: the real run learns its sha256


class FleetUserDataRequest(CalqueModel):
    spec: dict[str, Any] = Field(description="SessionHostSpec fields (fleet_class, region, session_config, ...)")
    bucket: str | None = Field(None, description="where the runtime is staged; None with runtime_pip")
    prefix: str = "calque"
    runtime_ttl: str = "7d"
    runtime_wheelhouse: bool = True
    runtime_pip: str | None = None


class FleetUserDataResult(CalqueModel):
    user_data: str
    runtime: RuntimeResult | None = None
    offers: list[str] = Field(default_factory=list)


@dataclass
class FleetUserDataPlan:
    request: FleetUserDataRequest
    spec: SessionHostSpec
    runtime: RuntimePlan | None


class FleetUserDataOp(Operation[FleetUserDataRequest, FleetUserDataPlan, FleetUserDataResult]):
    name = "session_fleet_user_data"
    Request = FleetUserDataRequest

    def plan(self, request: FleetUserDataRequest) -> FleetUserDataPlan:
        spec = validated(SessionHostSpec, request.spec, "invalid session-host class")
        validated(SessionConfig, spec.session_config, f"invalid session_config of class {spec.fleet_class}")
        validated(Institution, spec.institution, f"invalid institution of class {spec.fleet_class}")
        runtime = None
        if not request.runtime_pip:
            if not request.bucket:
                raise UsageError("give bucket (where the runtime is staged) or runtime_pip")
            staging = RuntimeRequest(
                bucket=request.bucket, prefix=request.prefix, ttl=request.runtime_ttl,
                wheelhouse=request.runtime_wheelhouse,
            )  # fmt: skip
            runtime = RuntimeOp(self.aws, self.say).plan(staging)
        return FleetUserDataPlan(request, spec, runtime)

    def check(self, plan: FleetUserDataPlan) -> Outcome[FleetUserDataResult]:
        staged = RuntimeOp(self.aws, self.say).check(plan.runtime) if plan.runtime else None
        return self._outcome(plan, staged, check_mode=True)

    def apply(self, plan: FleetUserDataPlan) -> Outcome[FleetUserDataResult]:
        staged = RuntimeOp(self.aws, self.say).apply(plan.runtime) if plan.runtime else None
        return self._outcome(plan, staged, check_mode=False)

    def _outcome(
        self, plan: FleetUserDataPlan, staged: Outcome[RuntimeResult] | None, *, check_mode: bool
    ) -> Outcome[FleetUserDataResult]:
        from calque.session.fleet.userdata import session_host_user_data

        runtime = staged.result if staged else None
        house_sha = runtime.wheelhouse_sha256 if runtime else None
        if runtime and runtime.wheelhouse_url and house_sha is None:
            house_sha = _UNBUILT
        user_data = session_host_user_data(
            plan.spec,
            runtime_url=runtime.url if runtime else None,
            runtime_sha256=runtime.sha256 if runtime and runtime.url else None,
            wheelhouse_url=runtime.wheelhouse_url if runtime else None,
            wheelhouse_sha256=house_sha,
            runtime_pip=plan.request.runtime_pip,
        )
        return Outcome[FleetUserDataResult](
            resource=self.name,
            check_mode=check_mode,
            changed=bool(staged and staged.changed),
            before={"runtime": staged.before} if staged else {},
            after={"runtime": staged.after} if staged else {},
            actions=list(staged.actions) if staged else [],
            result=FleetUserDataResult(user_data=user_data, runtime=runtime, offers=list(plan.spec.offers)),
        )
