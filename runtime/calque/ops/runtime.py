"""Staging the calque runtime wheel in a pool's bucket as an operation (``calque.pool.submitter.runtime_wheel``).

Check mode uploads nothing and predicts the real run from content (``predict_runtime``): the wheel
is built (or the given one read) into a temporary directory and hashed against the staged one's
sha256, a reused wheelhouse is packed and hashed, and the URLs are presigned locally (no API call),
so the user-data, and the pool's config digest made from it, are the real run's. A wheelhouse to
build is not downloaded in check mode: the staged one stands while the wheel is unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pydantic import Field

from calque.errors import UsageError
from calque.models.base import CalqueModel
from calque.ops.base import Operation
from calque.ops.outcome import Outcome


class RuntimeRequest(CalqueModel):
    """Where to stage the wheel and how long instances may download it."""

    bucket: str = Field(min_length=3)
    prefix: str = "calque"
    ttl: str = "3h"
    wheel: str | None = Field(None, description="a built calque wheel to stage instead of building one")
    wheelhouse: bool = Field(True, description="stage the pinned wheelhouse beside the wheel")
    wheelhouse_dir: str | None = Field(None, description="a built wheelhouse to stage instead of building one")
    python_version: str | None = Field(None, description="Python the wheelhouse is for; default this controller's")
    platform: str | None = Field(None, description="platform tag the wheelhouse is for; default this controller's")


class RuntimeResult(CalqueModel):
    bucket: str
    key: str
    sha256: str | None = None
    url: str | None = Field(
        None, description="presigned GET URL (check mode signs one too: only the signature differs)"
    )
    uploaded: bool = False
    wheelhouse_key: str | None = None
    wheelhouse_sha256: str | None = None
    wheelhouse_url: str | None = None


@dataclass
class RuntimePlan:
    request: RuntimeRequest
    key: str
    ttl_s: int


class RuntimeOp(Operation[RuntimeRequest, RuntimePlan, RuntimeResult]):
    name = "runtime"
    Request = RuntimeRequest

    def plan(self, request: RuntimeRequest) -> RuntimePlan:
        from calque.durations import parse_seconds
        from calque.pool.submitter.runtime_wheel import runtime_key

        if request.wheelhouse_dir and not request.wheelhouse:
            raise UsageError("a wheelhouse directory was given but wheelhouse staging is off: give one or the other")
        ttl_s = parse_seconds(request.ttl, what="ttl")
        return RuntimePlan(request, runtime_key(request.prefix), ttl_s)

    def check(self, plan: RuntimePlan) -> Outcome[RuntimeResult]:
        from calque.pool.submitter.runtime_wheel import predict_runtime

        r = plan.request
        predicted = predict_runtime(r.bucket, r.prefix, **self._staging(plan))
        staged = predicted.staged
        result = RuntimeResult(**{**asdict(staged), "uploaded": False})  # a check uploads nothing
        stored = {"sha256": predicted.stored_sha256, "wheelhouse_sha256": predicted.stored_wheelhouse_sha256}
        return self._outcome(plan, result, stored, staged.uploaded, True)

    def _staging(self, plan: RuntimePlan) -> dict[str, Any]:
        """``stage_runtime``'s (and ``predict_runtime``'s) keyword arguments for ``plan``."""
        r, aws = plan.request, self.aws
        return {
            "ttl_s": plan.ttl_s,
            "wheel": r.wheel,
            "wheelhouse": (r.wheelhouse_dir or True) if r.wheelhouse else False,
            "python_version": r.python_version,
            "platform": r.platform,
            "region": aws.region,
            "endpoint_url": aws.endpoint_url,
            "profile": aws.profile,
            "progress": self.say,
        }

    def apply(self, plan: RuntimePlan) -> Outcome[RuntimeResult]:
        from calque.pool.submitter.runtime_wheel import stage_runtime

        staged = stage_runtime(plan.request.bucket, plan.request.prefix, **self._staging(plan))
        result = RuntimeResult(**asdict(staged))
        before = None if staged.uploaded else staged.sha256
        house = None if staged.uploaded else staged.wheelhouse_sha256
        return self._outcome(plan, result, {"sha256": before, "wheelhouse_sha256": house}, staged.uploaded, False)

    def _outcome(
        self, plan: RuntimePlan, result: RuntimeResult, stored: dict[str, str | None], changed: bool, check_mode: bool
    ) -> Outcome[RuntimeResult]:
        uri = f"s3://{result.bucket}/{result.key}"
        after = {"sha256": result.sha256, "wheelhouse_sha256": result.wheelhouse_sha256}
        if not plan.request.wheelhouse:
            stored, after = {"sha256": stored["sha256"]}, {"sha256": result.sha256}
        return Outcome[RuntimeResult](
            resource=self.name,
            check_mode=check_mode,
            changed=changed,
            before={"key": result.key, **stored},
            after={"key": result.key, **after},
            actions=[f"upload the calque runtime to {uri}" + (" and its wheelhouse" if result.wheelhouse_key else "")]
            if changed
            else [],
            result=result,
        )
