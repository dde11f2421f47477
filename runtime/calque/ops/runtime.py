"""Staging the calque runtime wheel in a pool's bucket as an operation (``calque.pool.runtime_wheel``).

Check mode builds nothing and uploads nothing: it reads whether a wheel of this version is staged
(``changed`` when none is); whether a staged one has other bytes is known only by building it.
"""

from __future__ import annotations

from dataclasses import dataclass

from botocore.exceptions import ClientError
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
    url: str | None = Field(None, description="presigned GET URL; None in check mode")
    uploaded: bool = False
    wheelhouse_key: str | None = None
    wheelhouse_sha256: str | None = None
    wheelhouse_url: str | None = None


@dataclass
class RuntimePlan:
    request: RuntimeRequest
    key: str
    ttl_s: int


def _stored_sha(s3: object, bucket: str, key: str) -> str | None:
    from calque.aws.errors import aws_errors, is_not_found
    from calque.pool.runtime_wheel import SHA_METADATA

    with aws_errors(f"read s3://{bucket}/{key}"):
        try:
            head = s3.head_object(Bucket=bucket, Key=key)  # type: ignore[attr-defined]
        except ClientError as exc:
            if is_not_found(exc):
                return None
            raise
    sha: str | None = head.get("Metadata", {}).get(SHA_METADATA)
    return sha


class RuntimeOp(Operation[RuntimeRequest, RuntimePlan, RuntimeResult]):
    name = "runtime"
    Request = RuntimeRequest

    def plan(self, request: RuntimeRequest) -> RuntimePlan:
        from calque.durations import parse_seconds
        from calque.pool.runtime_wheel import runtime_key

        if request.wheelhouse_dir and not request.wheelhouse:
            raise UsageError("a wheelhouse directory was given but wheelhouse staging is off: give one or the other")
        ttl_s = parse_seconds(request.ttl, what="ttl")
        return RuntimePlan(request, runtime_key(request.prefix), ttl_s)

    def check(self, plan: RuntimePlan) -> Outcome[RuntimeResult]:
        r = plan.request
        stored = _stored_sha(self.aws.client("s3"), r.bucket, plan.key)
        return self._outcome(plan, RuntimeResult(bucket=r.bucket, key=plan.key, sha256=stored), stored, True)

    def apply(self, plan: RuntimePlan) -> Outcome[RuntimeResult]:
        from calque.pool.runtime_wheel import stage_runtime

        r, aws = plan.request, self.aws
        staged = stage_runtime(
            r.bucket,
            r.prefix,
            ttl_s=plan.ttl_s,
            wheel=r.wheel,
            wheelhouse=(r.wheelhouse_dir or True) if r.wheelhouse else False,
            python_version=r.python_version,
            platform=r.platform,
            region=aws.region,
            endpoint_url=aws.endpoint_url,
            profile=aws.profile,
            progress=self.say,
        )
        result = RuntimeResult(
            bucket=staged.bucket,
            key=staged.key,
            sha256=staged.sha256,
            url=staged.url,
            uploaded=staged.uploaded,
            wheelhouse_key=staged.wheelhouse_key,
            wheelhouse_sha256=staged.wheelhouse_sha256,
            wheelhouse_url=staged.wheelhouse_url,
        )
        return self._outcome(plan, result, None if staged.uploaded else staged.sha256, False)

    def _outcome(
        self, plan: RuntimePlan, result: RuntimeResult, stored: str | None, check_mode: bool
    ) -> Outcome[RuntimeResult]:
        uri = f"s3://{result.bucket}/{result.key}"
        changed = result.uploaded or (check_mode and stored is None)
        return Outcome[RuntimeResult](
            resource=self.name,
            check_mode=check_mode,
            changed=changed,
            before={"key": result.key, "sha256": stored},
            after={"key": result.key, "sha256": result.sha256 if not check_mode else stored},
            actions=[f"upload the calque wheel to {uri}"] if changed else [],
            result=result,
        )
