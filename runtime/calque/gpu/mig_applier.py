"""Apply a MIG plan (``planner.py`` makes it): each operation in turn, busy instances' processes
stopped first where the plan was forced, and a GPU reset only with ``allow_reset`` and when nothing
holds the GPU (persistence mode and the ``nvidia_drm`` module both hold it); where the platform cannot
reset, the result says a reboot is needed. A satisfied plan does nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from calque.gpu.backend import GpuBackend
from calque.gpu.migmodels import GpuApplyResult, MigApplyResult, MigOp, MigPlan
from calque.gpu.nvml_errors import GpuInUse, GpuNotSupported
from calque.gpu.stopping import terminate_processes
from calque.models import GpuProcess


def apply_plan(
    backend: GpuBackend,
    plan: MigPlan,
    *,
    allow_reset: bool = False,
    stop_processes: Callable[[list[GpuProcess]], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> MigApplyResult:
    """Execute ``plan``. Operations after a needed reset wait for it (``allow_reset``)."""
    say = progress or (lambda _m: None)
    results = []
    for gp in plan.gpus:
        res = GpuApplyResult(index=gp.index)
        results.append(res)
        pids = {pid for b in gp.busy_destroyed for pid in b.pids}
        if pids:
            victims = [p for p in backend.processes() if p.pid in pids]
            stopper = stop_processes or getattr(backend, "stop_processes", None) or terminate_processes
            say(f"GPU {gp.index}: stopping pids {sorted(pids)} (force)")
            stopper(victims)
        for op in gp.ops:
            if op.kind == "reset":
                if not allow_reset:
                    res.reset_required = True
                    break
                say(op.describe())
                try:
                    backend.reset_gpu(gp.index)
                except GpuNotSupported:
                    res.reboot_required = True
                    res.blocked = "this platform cannot reset the GPU: reboot the host to finish"
                    break
                except GpuInUse as exc:
                    res.reset_required = True
                    res.blocked = (
                        f"{exc}. Persistence mode (nvidia-smi -pm 0, stop nvidia-persistenced) and the nvidia_drm "
                        "module (modprobe -r nvidia_drm) hold the GPU; or reboot the host"
                    )
                    break
                res.done.append(op)
                continue
            say(op.describe())
            _run(backend, op)
            res.done.append(op)
    return MigApplyResult(
        config=plan.config,
        changed=any(r.done for r in results),
        gpus=results,
        mig_devices=backend.mig_devices(),
        reset_required=any(r.reset_required for r in results),
        reboot_required=any(r.reboot_required for r in results),
    )


def _run(b: GpuBackend, op: MigOp) -> None:
    i = op.gpu_index
    if op.kind == "destroy_ci":
        assert op.gi_id is not None and op.ci_id is not None
        b.destroy_compute_instance(i, op.gi_id, op.ci_id)
    elif op.kind == "destroy_gi":
        assert op.gi_id is not None
        b.destroy_gpu_instance(i, op.gi_id)
    elif op.kind == "set_mig_mode":
        b.set_mig_mode(i, bool(op.enabled))
    elif op.kind == "create_gi":
        assert op.profile_id is not None and op.start is not None
        gi = b.create_gpu_instance(i, op.profile_id, op.start)
        for n in op.compute_slices:
            b.create_compute_instance(i, gi.gi_id, n)
    elif op.kind == "create_ci":
        assert op.gi_id is not None
        for n in op.compute_slices:
            b.create_compute_instance(i, op.gi_id, n)
