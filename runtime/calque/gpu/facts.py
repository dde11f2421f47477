"""Facts about a host's GPUs: ``calque gpu info`` and the ``calque.gpu.gpu_info`` module."""

from __future__ import annotations

import shutil

from pydantic import Field

from calque.gpu.backend import GpuBackend
from calque.gpu.catalog import Card
from calque.gpu.layout import card_of
from calque.gpu.mps_control import MpsControl
from calque.models import GpuDevice, GpuInstance, GpuProcess, MigDevice
from calque.models.base import CalqueModel
from calque.models.mps import MpsStatus


class GpuFacts(CalqueModel):
    """One GPU: what the driver reports, its MIG instances and processes, and its catalog entry."""

    gpu: GpuDevice
    gpu_instances: list[GpuInstance] = Field(default_factory=list)
    mig_devices: list[MigDevice] = Field(default_factory=list)
    processes: list[GpuProcess] = Field(default_factory=list, description="on the GPU and its MIG devices")
    catalog: Card | None = None


class HostGpuFacts(CalqueModel):
    version: int = 1
    backend: str
    driver_version: str
    gpus: list[GpuFacts]
    mps: MpsStatus | None = Field(None, description="None when the MPS control program is not installed")


def gather(backend: GpuBackend, mps: MpsControl | None = None) -> HostGpuFacts:
    """Everything calque knows about this host's GPUs, read-only."""
    migs = backend.mig_devices()
    procs = backend.processes()
    out = []
    for g in backend.gpus():
        mine = [d for d in migs if d.gpu_index == g.index]
        uuids = {g.uuid} | {d.uuid for d in mine}
        out.append(
            GpuFacts(
                gpu=g,
                gpu_instances=backend.gpu_instances(g.index) if g.mig_current else [],
                mig_devices=mine,
                processes=[p for p in procs if p.device_uuid in uuids],
                catalog=card_of(g),
            )
        )
    mps_status = None
    if mps is not None and shutil.which(mps.program):
        mps_status = mps.status()
    return HostGpuFacts(
        backend=type(backend).__name__,
        driver_version=backend.driver_version(),
        gpus=out,
        mps=mps_status,
    )
