"""Who uses each MIG instance of one GPU: processes (the GPU backend's list) and live sessions (the
session daemon's list, given by the caller), so the planner treats a checked-out slice like one that
runs processes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from calque.gpu.migmodels import BusyInstance, SliceHolder
from calque.models import GpuInstance, GpuProcess, MigDevice

# Both spellings: the CLI's flag and the gpu_layout role's variable (a refusal is read in either place).
FORCE_HINT = (
    "check those sessions in and stop those processes first, or force it (--force; calque_gpu_layout_force: true "
    "in the calque.gpu.gpu_layout role), which ends those sessions (reason layout) and stops those processes"
)


class Occupancy:
    """The processes and sessions on the instances of GPU ``index``."""

    def __init__(
        self,
        index: int,
        procs: Sequence[GpuProcess],
        migs: Sequence[MigDevice],
        holders: Mapping[str, list[SliceHolder]],
    ) -> None:
        self.index = index
        self._pids: dict[str, list[int]] = {}
        for proc in procs:
            self._pids.setdefault(proc.device_uuid, []).append(proc.pid)
        self._uuid_of = {(d.gi_id, d.ci_id): d.uuid for d in migs if d.gpu_index == index}
        self._holders = holders

    def _uuids(self, gi: GpuInstance) -> list[str]:
        return [u for ci in gi.compute_instances if (u := self._uuid_of.get((gi.gi_id, ci.ci_id)))]

    def pids(self, gi: GpuInstance) -> list[int]:
        return sorted(pid for u in self._uuids(gi) for pid in self._pids.get(u, []))

    def sessions(self, gi: GpuInstance) -> list[SliceHolder]:
        return [h for u in self._uuids(gi) for h in self._holders.get(u, [])]

    def busy(self, gi: GpuInstance) -> bool:
        return bool(self.pids(gi) or self.sessions(gi))

    def instance(self, gi: GpuInstance) -> BusyInstance:
        return BusyInstance(
            gpu_index=self.index,
            gi_id=gi.gi_id,
            profile=gi.profile,
            start=gi.placement_start,
            pids=self.pids(gi),
            sessions=self.sessions(gi),
        )

    def describe(self, busy: Sequence[GpuInstance]) -> str:
        return "; ".join(self.instance(gi).describe() for gi in busy)
