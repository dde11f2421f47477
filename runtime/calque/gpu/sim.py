"""A simulated GPU host: the driver of ``sim_driver.py``, and the hands of a test or the sandbox on it.

The driver (``sim_driver.py``) is what calque's code calls, as it would call NVML; ``SimGpu`` adds the
controls for what happens to a host without a driver call. Separate processes share one host through
its state file.

Typical use in a test::

    sim = SimGpu.create(tmp_path / "gpus.json", cards=["A100-40GB"] * 2, mig=True)
    devs = sim.create_instances(0, ["3g.20gb", "2g.10gb", "1g.5gb"])
    sim.set_processes(devs[0].uuid, [4242])
    sim.capability_devices(devs[0])   # ['<root>/dev/nvidia-caps/nvidia-cap21', ...]
"""

from __future__ import annotations

from collections.abc import Sequence

from calque.gpu import nvml_errors as nv
from calque.gpu.placement import place
from calque.gpu.sim_driver import SimDriver
from calque.gpu.simload import set_load
from calque.gpu.simstate import (
    DEFAULT_DRIVER_VERSION,
    SIM_STATE_VERSION,
    SimCard,
    SimComputeInstance,
    SimGpuInstance,
    SimState,
    catalog_card,
    device_uuids,
    placed,
)
from calque.models import GpuProcess, MigDevice

__all__ = [
    "DEFAULT_DRIVER_VERSION",
    "SIM_STATE_VERSION",
    "SimCard",
    "SimComputeInstance",
    "SimGpu",
    "SimGpuInstance",
    "SimState",
]


class SimGpu(SimDriver):
    """A simulated GPU host: the driver's calls (``SimDriver``), and what happens to a host that no
    driver call does (processes come and go, kernel clients hold a GPU, the host reboots)."""

    # -- controls for tests and the sandbox (not driver calls) ---------------------------------

    def enable_mig(self, index: int | None = None) -> None:
        """Turn MIG on and make it current (as after a reset) on one or every MIG-capable GPU."""
        with self._change(driver_call=False) as st:
            for c in st.cards if index is None else [self._card(st, index)]:
                if catalog_card(c).mig:
                    c.mig_current = c.mig_pending = True
                elif index is not None:
                    raise nv.driver_error(nv.NOT_SUPPORTED, f"GPU {index} ({c.card}) does not support MIG")

    def create_instances(
        self, index: int, profiles: Sequence[str], compute_split: Sequence[int] | None = None
    ) -> list[MigDevice]:
        """Create GPU instances of ``profiles`` (names) wherever they fit, each with one compute instance
        (or, with ``compute_split``, one CI per entry in every new GI); returns the new MIG devices."""
        st = self.state()
        c = self._card(st, index)
        card = catalog_card(c)
        wanted = [card.profile(n) for n in profiles]
        plan = place(card, placed(c), wanted)
        if plan is None:
            raise nv.driver_error(
                nv.INSUFFICIENT_RESOURCES, f"{', '.join(profiles)} do not fit beside GPU {index}'s current instances"
            )
        before = {d.uuid for d in self.mig_devices()}
        for p, start in plan:
            gi = self.create_gpu_instance(index, p.profile_id, start)
            for n in compute_split or [p.compute_slices]:
                self.create_compute_instance(index, gi.gi_id, n)
        return [d for d in self.mig_devices() if d.uuid not in before]

    def set_processes(self, device_uuid: str, processes: Sequence[GpuProcess | int]) -> None:
        """Replace the processes running on one device (a GPU-... or MIG-... UUID)."""
        self._put_processes(device_uuid, processes, replace=True)

    def add_process(self, device_uuid: str, pid: int, used_memory_mib: int = 0) -> None:
        """Add one process to a device (one locked change, safe from several processes at once)."""
        self._put_processes(
            device_uuid, [GpuProcess(pid=pid, used_memory_mib=used_memory_mib, device_uuid=device_uuid)]
        )

    def _put_processes(self, device_uuid: str, processes: Sequence[GpuProcess | int], replace: bool = False) -> None:
        with self._change(driver_call=False) as st:
            owner = next((c for c in st.cards if device_uuid in device_uuids(c)), None)
            if owner is None:
                raise nv.driver_error(nv.NOT_FOUND, f"no GPU or MIG device {device_uuid} on this host")
            if owner.mig_current and device_uuid == owner.uuid:
                raise nv.driver_error(
                    nv.INVALID_ARGUMENT, f"GPU {owner.index} is in MIG mode: processes run on its MIG devices"
                )
            procs = [
                GpuProcess(pid=p, device_uuid=device_uuid)
                if isinstance(p, int)
                else p.model_copy(update={"device_uuid": device_uuid})
                for p in processes
            ]
            keep = [p for p in st.processes if not (replace and p.device_uuid == device_uuid)]
            st.processes = keep + procs

    def set_load(
        self, device_uuid: str, util_percent: float | None, memory_mib: int | None = None, pid: int | None = None
    ) -> None:
        """A device's (or, with ``pid``, one process's) activity and memory; None and None: unknown again."""
        with self._change(driver_call=False) as st:
            set_load(st, device_uuid, util_percent, memory_mib, pid)

    def stop_processes(self, processes: Sequence[GpuProcess]) -> None:
        """The listed processes exit (what the MIG applier's ``force`` does on a simulated host)."""
        gone = {(p.pid, p.device_uuid) for p in processes}
        with self._change(driver_call=False) as st:
            st.processes = [p for p in st.processes if (p.pid, p.device_uuid) not in gone]

    def clear_processes(self, device_uuid: str | None = None) -> None:
        """Remove the processes of one device, or of every device."""
        with self._change(driver_call=False) as st:
            st.processes = [p for p in st.processes if device_uuid is not None and p.device_uuid != device_uuid]

    def set_persistence_mode(self, index: int, enabled: bool) -> None:
        with self._change(driver_call=False) as st:
            self._card(st, index).persistence_mode = enabled

    def set_holders(self, index: int, holders: Sequence[str]) -> None:
        """Kernel clients holding the GPU open (e.g. ``["nvidia_drm"]``): they block a reset."""
        with self._change(driver_call=False) as st:
            self._card(st, index).holders = list(holders)

    def set_reset_supported(self, index: int, supported: bool) -> None:
        with self._change(driver_call=False) as st:
            self._card(st, index).reset_supported = supported

    def set_privileged(self, privileged: bool) -> None:
        """False: every driver change fails with NVML_ERROR_NO_PERMISSION (as for a non-root user)."""
        with self._change(driver_call=False) as st:
            st.privileged = privileged

    def reboot(self) -> None:
        """A host reboot: pending MIG modes become current, instances and processes are gone."""
        with self._change(driver_call=False) as st:
            for c in st.cards:
                c.mig_current = c.mig_pending
                c.gis = []
                c.compute_mode = "DEFAULT"
            st.processes, st.load = [], {}
