"""A GPU reset through ``nvidia-smi --gpu-reset``: NVML has no reset call, so the NVML backend runs this."""

from __future__ import annotations

import subprocess

from calque.gpu import nvml_errors as nv


def nvidia_smi_reset(index: int, timeout_s: float = 120) -> None:
    """Reset GPU ``index``; a refusal becomes NOT_SUPPORTED (the platform cannot) or IN_USE (something holds it)."""
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--gpu-reset", "-i", str(index)], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise nv.driver_error(nv.UNKNOWN, f"could not run nvidia-smi --gpu-reset: {exc}") from exc
    if proc.returncode != 0:
        msg = (proc.stdout + proc.stderr).strip()
        code = nv.NOT_SUPPORTED if "not supported" in msg.lower() else nv.IN_USE
        raise nv.driver_error(code, f"GPU {index} reset failed: {msg}")
