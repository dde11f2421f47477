"""Reading a host's GPU facts as an operation that never changes anything (``calque.gpu.facts.gather``)."""

from __future__ import annotations

from calque.gpu.facts import HostGpuFacts, gather
from calque.gpu.mps_control import DEFAULT_LOG_ROOT, DEFAULT_PIPE_ROOT, MpsControl
from calque.ops.base import Operation
from calque.ops.gpu_host import GpuHostRequest
from calque.ops.outcome import Outcome


class GpuFactsRequest(GpuHostRequest):
    pipe_root: str = str(DEFAULT_PIPE_ROOT)
    log_root: str = str(DEFAULT_LOG_ROOT)


class GpuFactsOp(Operation[GpuFactsRequest, HostGpuFacts, HostGpuFacts]):
    name = "gpu_info"
    Request = GpuFactsRequest

    def plan(self, request: GpuFactsRequest) -> HostGpuFacts:
        backend = request.backend()
        return gather(backend, MpsControl(backend, pipe_root=request.pipe_root, log_root=request.log_root))

    def check(self, plan: HostGpuFacts) -> Outcome[HostGpuFacts]:
        return Outcome[HostGpuFacts](resource=self.name, check_mode=True, changed=False, result=plan)

    def apply(self, plan: HostGpuFacts) -> Outcome[HostGpuFacts]:
        return Outcome[HostGpuFacts](resource=self.name, changed=False, result=plan)
