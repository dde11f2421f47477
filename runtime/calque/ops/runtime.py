"""Staging the calque runtime wheel in a pool's bucket as an operation (``calque.pool.runtime_wheel``).

Check mode builds nothing and uploads nothing: it reads whether a wheel of this version is staged
(``changed`` when none is); whether a staged one has other bytes is known only by building it.
"""

from __future__ import annotations

from dataclasses import dataclass

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import Field

from calque.errors import InfrastructureError, UsageError
from calque.models.base import CalqueModel
from calque.ops.base import Operation
from calque.ops.outcome import Outcome


class RuntimeRequest(CalqueModel):
    """Where to stage the wheel and how long instances may download it."""

    bucket: str = Field(min_length=3)
    prefix: str = "calque"
    ttl: str = "3h"
    wheel: str | None = Field(None, description="a built calque wheel to stage instead of building one")


class RuntimeResult(CalqueModel):
    bucket: str
    key: str
    sha256: str | None = None
    url: str | None = Field(None, description="presigned GET URL; None in check mode")
    uploaded: bool = False


@dataclass
class RuntimePlan:
    request: RuntimeRequest
    key: str
    ttl_s: int


def _stored_sha(s3: object, bucket: str, key: str) -> str | None:
    from calque.pool.runtime_wheel import SHA_METADATA

    try:
        head = s3.head_object(Bucket=bucket, Key=key)  # type: ignore[attr-defined]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
            return None
        raise InfrastructureError(f"cannot read s3://{bucket}/{key}: {exc}") from exc
    except BotoCoreError as exc:
        raise InfrastructureError(f"cannot reach S3 to read s3://{bucket}/{key}: {exc}") from exc
    sha: str | None = head.get("Metadata", {}).get(SHA_METADATA)
    return sha


class RuntimeOp(Operation[RuntimeRequest, RuntimePlan, RuntimeResult]):
    name = "runtime"
    Request = RuntimeRequest

    def plan(self, request: RuntimeRequest) -> RuntimePlan:
        from calque.models.acquire import parse_duration
        from calque.pool.runtime_wheel import runtime_key

        try:
            ttl_s = parse_duration(request.ttl, what="ttl")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
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
            region=aws.region,
            endpoint_url=aws.endpoint_url,
            profile=aws.profile,
        )
        result = RuntimeResult(
            bucket=staged.bucket, key=staged.key, sha256=staged.sha256, url=staged.url, uploaded=staged.uploaded
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
