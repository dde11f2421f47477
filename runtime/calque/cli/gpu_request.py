"""What ``calque gpu`` and ``calque gpu mig`` both turn their backend flags into: an open backend,
the GPU options of an ops request, and the progress line of a long step."""

from __future__ import annotations

from typing import Any

import click

from calque.errors import UsageError
from calque.gpu.backend import GpuBackend
from calque.gpu.selection import GpuSelection, open_gpu


def open_backend(gpu: GpuSelection) -> GpuBackend:
    return open_gpu(gpu)


def request_backend(gpu: GpuSelection) -> dict[str, Any]:
    """The GPU options of an ops request (``GpuHostRequest``), from the CLI's backend flags."""
    if gpu.backend == "none":
        raise UsageError("this command needs a GPU: choose --gpu-backend host, nvml or sim")
    return {
        "gpu_backend": gpu.backend,
        "sim_state": str(gpu.sim_state) if gpu.sim_state is not None else None,
        "host_config": str(gpu.host_config) if gpu.host_config is not None else None,
    }


def progress(message: str) -> None:
    click.echo(message, err=True)
