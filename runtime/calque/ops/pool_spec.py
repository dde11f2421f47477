"""A pool's spec file and the worker user-data made from it, as an operation.

The spec is validated as a ``PoolSpec``; the runtime the instances install is, in order: an
explicit pip requirement (``runtime_pip``), an already staged wheel (``runtime_url`` and its
``runtime_sha256``), or this controller's wheel staged in the spec's bucket now (``stage_runtime``,
through ``RuntimeOp``). The file is written only when its text differs (mode 0600: it names the
pool's bucket and queue). Check mode stages and writes nothing; its user-data is the real run's
(``RuntimeOp.check``: the sha256s from content, the URLs signed locally), so the config digest the
pool's group computes from it is the one the real run will launch with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from calque.models import PoolSpec
from calque.models.base import CalqueModel
from calque.ops.base import Operation, validated
from calque.ops.outcome import Outcome
from calque.ops.runtime import RuntimeOp, RuntimePlan, RuntimeRequest, RuntimeResult

_UNBUILT = "0" * 64  # no wheelhouse has this sha256: a digest made with it differs from every staged one


class PoolSpecRequest(CalqueModel):
    """The spec's fields, where to keep it, and where the instances get the runtime from."""

    spec: dict[str, Any] = Field(description="PoolSpec fields (model, workload, bucket, ...)")
    path: str | None = Field(None, description="write the spec file here; None writes nothing")
    stage_runtime: bool = True
    runtime_ttl: str = "3h"
    runtime_wheel: str | None = None
    runtime_wheelhouse: bool = True
    runtime_wheelhouse_dir: str | None = None
    runtime_pip: str | None = None
    runtime_url: str | None = None
    runtime_sha256: str | None = None
    wheelhouse_url: str | None = None
    wheelhouse_sha256: str | None = None


class PoolSpecResult(CalqueModel):
    spec: dict[str, Any]
    path: str | None = None
    user_data: str
    runtime: RuntimeResult | None = None


@dataclass
class PoolSpecPlan:
    request: PoolSpecRequest
    spec: PoolSpec
    text: str
    current: str | None  # the file's text now; None when absent (or no path)
    runtime: RuntimePlan | None  # None: nothing to stage


def _read(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


class PoolSpecOp(Operation[PoolSpecRequest, PoolSpecPlan, PoolSpecResult]):
    name = "pool_spec"
    Request = PoolSpecRequest

    def _runtime_op(self) -> RuntimeOp:
        return RuntimeOp(self.aws, self.say)

    def plan(self, request: PoolSpecRequest) -> PoolSpecPlan:
        from calque.pool.bootstrap import spec_yaml

        spec = validated(PoolSpec, request.spec, "invalid pool spec")
        runtime = None
        if request.stage_runtime and not request.runtime_pip and not request.runtime_url:
            staging = RuntimeRequest(
                bucket=spec.bucket,
                prefix=spec.prefix,
                ttl=request.runtime_ttl,
                wheel=request.runtime_wheel,
                wheelhouse=request.runtime_wheelhouse,
                wheelhouse_dir=request.runtime_wheelhouse_dir,
            )
            runtime = self._runtime_op().plan(staging)
        return PoolSpecPlan(request, spec, spec_yaml(spec), _read(request.path), runtime)

    def check(self, plan: PoolSpecPlan) -> Outcome[PoolSpecResult]:
        staged = self._runtime_op().check(plan.runtime) if plan.runtime else None
        return self._outcome(plan, staged, plan.request.path is not None and plan.current != plan.text, True)

    def apply(self, plan: PoolSpecPlan) -> Outcome[PoolSpecResult]:
        staged = self._runtime_op().apply(plan.runtime) if plan.runtime else None
        written = plan.request.path is not None and plan.current != plan.text
        if written:
            from calque.pool.bootstrap import write_spec

            assert plan.request.path is not None
            Path(plan.request.path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_spec(plan.spec, plan.request.path)
        return self._outcome(plan, staged, written, False)

    def _outcome(
        self, plan: PoolSpecPlan, staged: Outcome[RuntimeResult] | None, written: bool, check_mode: bool
    ) -> Outcome[PoolSpecResult]:
        from calque.pool.bootstrap import worker_user_data

        r = plan.request
        runtime = staged.result if staged else None
        url = runtime.url if runtime else r.runtime_url
        sha = runtime.sha256 if runtime and runtime.url else r.runtime_sha256
        house_sha = runtime.wheelhouse_sha256 if runtime else r.wheelhouse_sha256
        if runtime and runtime.wheelhouse_url and house_sha is None:
            house_sha = _UNBUILT  # check mode, a new wheel: the real run builds the wheelhouse and learns its sha256
        user_data = worker_user_data(
            plan.spec,
            runtime_pip=r.runtime_pip or None,
            runtime_url=url,
            runtime_sha256=sha,
            wheelhouse_url=runtime.wheelhouse_url if runtime else r.wheelhouse_url,
            wheelhouse_sha256=house_sha,
        )
        actions = list(staged.actions) if staged else []
        actions += [f"write the pool spec to {r.path}"] if written else []
        return Outcome[PoolSpecResult](
            resource=self.name,
            check_mode=check_mode,
            changed=written or bool(staged and staged.changed),
            before={"spec": plan.current, **({"runtime": staged.before} if staged else {})},
            after={"spec": plan.text if r.path else None, **({"runtime": staged.after} if staged else {})},
            actions=actions,
            result=PoolSpecResult(
                spec=plan.spec.model_dump(mode="json"), path=r.path, user_data=user_data, runtime=runtime
            ),
        )
