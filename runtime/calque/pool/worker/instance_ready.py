"""An instance's steps up to "ready", and the launching lifecycle hook they complete (Layer 1).

``calque pool warm-up --spec FILE`` runs on the instance, from the user-data once the runtime is
installed, and again as the worker unit's ``ExecStartPre`` on every boot:

1. it reads its instance id and ``autoscaling/target-lifecycle-state`` from IMDSv2;
2. when the instance is being warmed (``Warmed:*``; or off an instance) and no ready mark for this
   workload is there already, it downloads the workload and runs the workload's own weight steps:
   its ``@modal.build()`` methods (Modal runs them once per image; their files are the image's) and
   its ``@modal.enter(snap=True)`` methods (Modal runs them before a memory snapshot), with the
   usual caches (``HF_HOME``, ``TORCH_HOME``, ``XDG_CACHE_HOME``) pointed under
   ``CALQUE_WEIGHTS_CACHE`` so that what they download stays on the instance's disk for the worker;
   then it writes the ready mark;
3. it completes the ``calque-ready`` hook: CONTINUE once ready, ABANDON when a step raised (AWS
   then terminates the instance rather than warm a broken one).

At each boot it writes the boot's usage record (``pool/worker/usage.py``: from the kernel's boot
time; ended ``stopped`` when the instance goes to stop in the warm pool, ``terminated`` on ABANDON;
refreshed while it waits in a ``Warmed:Running`` pool).

An instance launched straight into service (the warm pool empty) skips step 2: its worker's own
start runs ``@build`` and every ``@enter`` once, as without a warm pool.

With ``--wait-in-service`` (the worker unit) it first waits while the instance is warmed (a
``Running`` warm pool keeps its instances up with no worker) until AWS moves it into service. A
stopped memory is not kept: ``Stopped`` instances keep the disk cache, and the worker runs its
``@enter`` again from it; the worker skips ``@build`` when the mark matches (``skip_built``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from calque.aws.acquire.warm_pool import LAUNCH_HOOK
from calque.aws.aws_errors import BotoCoreError, ClientError, error_code
from calque.aws.clients import client
from calque.aws.imds import Imds, metadata_client
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.errors import UsageError
from calque.models import PoolSpec
from calque.models.base import CalqueModel
from calque.models.instance_usage import RECORD_HEARTBEAT_S
from calque.models.pool_names import pool_names
from calque.models.warmth import ReadyMark
from calque.pool.bootstrap import materialize_workload
from calque.pool.worker.usage import InstanceUsage, boot_time
from calque.warm.loader import Workload, load_workload, split_workload, workload_digest

log = logging.getLogger("calque.pool.worker.instance_ready")
READY_ENV = "CALQUE_READY_MARK"
WEIGHTS_ENV = "CALQUE_WEIGHTS_CACHE"
DEFAULT_READY = "/var/lib/calque/ready.json"
DEFAULT_WEIGHTS = "/var/lib/calque/cache"
TTL_ENV = "CALQUE_TTL_MARK"
DEFAULT_TTL_MARK = "/var/lib/calque/expires-epoch"  # the group's TTL boothook's deadline (template.py)
WARMED = "Warmed:"  # the prefix of every warm-pool target state (Warmed:Stopped, Warmed:Running, ...)
WARMED_RUNNING = "Warmed:Running"  # the one warm state whose instances stay up (and paid)


class WarmUpReport(CalqueModel):
    instance_id: str | None
    target_state: str | None
    prepared: bool
    lifecycle: str | None = None
    seconds: float = 0.0


def ready_path() -> Path:
    return Path(os.environ.get(READY_ENV) or DEFAULT_READY)


def cache_env() -> dict[str, str]:
    """The cache variables the weight steps and the worker share (an operator's own values win)."""
    root = Path(os.environ.get(WEIGHTS_ENV) or DEFAULT_WEIGHTS)
    return {
        WEIGHTS_ENV: str(root),
        "HF_HOME": str(root / "huggingface"),
        "TORCH_HOME": str(root / "torch"),
        "XDG_CACHE_HOME": str(root / "xdg"),
    }


def read_mark(path: Path | None = None) -> ReadyMark | None:
    p = path or ready_path()
    try:
        return ReadyMark.model_validate_json(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def skip_built(workload: Workload) -> Workload:
    """The worker's workload without ``@build`` when the bootstrap already ran it for this workload."""
    mark = read_mark()
    if mark is not None and mark.workload_digest == workload.digest and workload.build:
        log.info("skipping @build: the bootstrap ran it at %s (%s)", mark.at.isoformat(), ready_path())
        workload.build = []
    return workload


def _run(hook: Any) -> None:
    result = hook()
    if asyncio.iscoroutine(result):
        asyncio.run(result)


def prepare(spec: PoolSpec) -> ReadyMark:
    """Download the workload, run its weight steps into the local cache, write the ready mark."""
    for key, value in cache_env().items():
        os.environ.setdefault(key, value)
        Path(os.environ[key]).mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    local = materialize_workload(spec)
    workload = load_workload(local.workload, dict(local.parameters))
    steps = []
    for hook in [*workload.build, *workload.enter_snap]:
        name = getattr(hook, "__qualname__", repr(hook))
        log.info("warm-up: running %s", name)
        _run(hook)
        steps.append(name)
    path, target = split_workload(local.workload)
    mark = ReadyMark(
        source=workload_digest(path.read_bytes(), target or "", dict(local.parameters)),
        workload_digest=workload.digest,
        steps=steps,
        seconds=round(time.monotonic() - started, 3),
        at=datetime.now(timezone.utc),
    )
    path = ready_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ready-")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(mark.model_dump_json())
    os.replace(tmp, path)
    return mark


def source_key(spec: PoolSpec) -> str:
    """The workload as downloaded (script bytes, the URI's target, the parameters), without importing it."""
    local = materialize_workload(spec)
    path, target = split_workload(local.workload)
    return workload_digest(path.read_bytes(), target or "", dict(local.parameters))


def _is_ready(spec: PoolSpec) -> bool:
    mark = read_mark()
    return mark is not None and mark.source == source_key(spec)


def _complete(spec: PoolSpec, instance_id: str, result: str) -> str:
    """Complete ``calque-ready`` for this instance; 'none waiting' when no action is open (no hook, or done)."""
    assert spec.pool is not None
    asg = client("autoscaling", region=spec.region, endpoint_url=spec.endpoint_url)
    try:
        asg.complete_lifecycle_action(
            LifecycleHookName=LAUNCH_HOOK,
            AutoScalingGroupName=pool_names(spec.pool).group,
            InstanceId=instance_id,
            LifecycleActionResult=result,
        )
    except ClientError as exc:
        if error_code(exc) == "ValidationError":  # no hook on the group, or completed already (the user-data)
            log.info("no %s action open for %s: %s", LAUNCH_HOOK, instance_id, exc)
            return "none waiting"
        raise
    log.info("completed lifecycle action %s for %s: %s", LAUNCH_HOOK, instance_id, result)
    return result


def _usage(spec: PoolSpec, imds: Imds | None, instance_id: str | None, state: str | None) -> InstanceUsage | None:
    """This boot's usage record, from the kernel's boot time (EC2 bills from the boot, not from this step)."""
    if imds is None or not instance_id or spec.pool is None:
        return None
    instance_type = spec.instance_type or imds.get("instance-type")
    if not instance_type:
        return None
    s3 = client("s3", region=spec.region, endpoint_url=spec.endpoint_url)
    store = RunStore(s3, spec.bucket, spec.prefix, PoolQueue(None, spec.model, spec.queue_name).name)
    usage = InstanceUsage(store, spec.pool, instance_id, instance_type, "warm-up", boot_time(), state)
    usage.beat()
    return usage


def warm_up(spec: PoolSpec, *, wait_in_service: bool = False, poll_s: float = 5.0) -> WarmUpReport:
    """Steps 1-3 of the module's docstring, for this instance (off an instance: step 2 only)."""
    started = time.monotonic()
    imds = metadata_client(spec.imds_endpoint)
    instance_id = state = None
    if imds is None:
        log.info("offline: not reaching the metadata service %s; preparing only", spec.imds_endpoint)
    else:
        try:
            instance_id = imds.get("instance-id")
            state = imds.get("autoscaling/target-lifecycle-state")
        except OSError as exc:  # URLError is an OSError: no metadata service, not an instance
            log.info("no instance metadata (%s): preparing only", exc)
    usage = _usage(spec, imds, instance_id, state)
    beaten = time.monotonic()
    while wait_in_service and imds is not None and state and state.startswith(WARMED):
        time.sleep(poll_s)  # systemd bounds this wait (the unit's start timeout)
        state = imds.get("autoscaling/target-lifecycle-state")
        if usage is not None and time.monotonic() - beaten >= RECORD_HEARTBEAT_S:  # Warmed:Running is paid
            usage.beat()
            beaten = time.monotonic()
    report = WarmUpReport(instance_id=instance_id, target_state=state, prepared=False)
    if state and state.startswith(WARMED):  # the TTL counts from the start in service, not this first boot
        Path(os.environ.get(TTL_ENV) or DEFAULT_TTL_MARK).unlink(missing_ok=True)
    hooked = bool(instance_id and state and spec.pool)
    # Into service straight from a cold launch, the worker's own start does every step (once); warmed,
    # or off an instance, the steps run here so that a later start repeats nothing.
    warming = state is None or state.startswith(WARMED)
    try:
        if warming and not _is_ready(spec):
            prepare(spec)
            report.prepared = True
    except Exception:
        if usage is not None:
            usage.finish("terminated" if hooked else None)  # ABANDON: AWS terminates it
        if hooked:
            assert instance_id is not None
            try:
                report.lifecycle = _complete(spec, instance_id, "ABANDON")
            except (ClientError, BotoCoreError) as exc:
                log.error("cannot abandon the lifecycle action (%s); its timeout abandons it", exc)
        raise
    if usage is not None:  # before the hook: a warmed instance may stop the moment it is completed
        stops = bool(state and state.startswith(WARMED) and state != WARMED_RUNNING)
        usage.finish("stopped" if stops else None)
    if hooked:
        assert instance_id is not None
        try:
            report.lifecycle = _complete(spec, instance_id, "CONTINUE")
        except (ClientError, BotoCoreError) as exc:
            raise UsageError(f"the instance is ready but {LAUNCH_HOOK} could not be completed: {exc}") from exc
    report.seconds = round(time.monotonic() - started, 3)
    return report
