"""A simulated GPU host's driver: the ``GpuBackend`` calls, as strict as the driver, over one locked state file.

The simulator models cards from the catalog: MIG mode current vs pending (a change takes effect at
a GPU reset), resets refused while processes, persistence mode or a kernel client (``nvidia_drm``)
hold the GPU, GPU instances only at valid placements and within max counts, at most one +me
instance, compute instances inside GPU instances, destroys refused while something runs inside,
deterministic UUIDs, running processes per device, and NVML's error codes. Separate processes (a
module run, the session daemon, a worker) share one machine: every call reads the state file under
an ``fcntl`` lock and every change is written to a temporary file and renamed into place.

It also writes, under its root directory, the files a driver publishes for each MIG device: the
``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]/access`` files and the
``/dev/nvidia-caps/nvidia-capN`` nodes (plain files here). What no driver call does (processes
starting, kernel holders, a reboot) is ``sim.py``'s ``SimGpu``, which tests and the sandbox use.
"""

from __future__ import annotations

import contextlib
import socket
import uuid as uuidlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from calque.errors import InfrastructureError, UsageError
from calque.gpu import nvml_errors as nv
from calque.gpu.backend import COMPUTE_MODES
from calque.gpu.caps import mig_capability_devices
from calque.gpu.catalog import COMPUTE_INSTANCE_PROFILES, load_catalog
from calque.gpu.placement import problems
from calque.gpu.simload import sim_samples
from calque.gpu.simstate import (
    DEFAULT_DRIVER_VERSION,
    NS,
    SimCard,
    SimComputeInstance,
    SimGpuInstance,
    SimState,
    SimStateFile,
    catalog_card,
    device_uuids,
    gi_id_for,
    gpu_instance_view,
    mig_devices_of,
    mig_uuid,
    placed,
    profile_of,
    sync_files,
)
from calque.models import DeviceSample, GpuDevice, GpuInstance, GpuProcess, MigDevice

S = TypeVar("S", bound="SimDriver")


class SimDriver:
    """A simulated GPU host backed by one state file; implements ``GpuBackend``."""

    def __init__(self, state_path: Path | str) -> None:
        self.state_path = Path(state_path)
        if not self.state_path.exists():
            raise InfrastructureError(
                f"no simulated GPU host at {self.state_path}: create one with SimGpu.create() "
                "or set gpu.sim.cards / gpu.sim.instance_type in the host configuration"
            )
        self._file = SimStateFile(self.state_path)

    # -- creation -------------------------------------------------------------------------------

    @classmethod
    def create(
        cls: type[S],
        state_path: Path | str,
        cards: Sequence[str] | None = None,
        *,
        instance_type: str | None = None,
        root: Path | str | None = None,
        seed: str | None = None,
        mig: bool = False,
        persistence_mode: bool = False,
        driver_version: str = DEFAULT_DRIVER_VERSION,
        replace: bool = True,
    ) -> S:
        """Create (or replace) a simulated host with ``cards`` (catalog keys) or an EC2 ``instance_type``.

        With ``replace=False`` an existing state file is kept and opened (safe when several processes
        race to create the same host).

        ``root`` (default: ``<state file>.root`` beside it) receives the proc and dev files.
        ``mig=True`` starts every MIG-capable card with MIG mode enabled and current.
        GPU UUIDs derive from ``seed``, by default this host's name: deterministic on one host, and
        different on two (a fleet of simulated hosts must not share a GPU UUID, as real ones never do).
        """
        cat = load_catalog()
        if instance_type is not None:
            if cards:
                raise UsageError("give cards or instance_type, not both")
            card, n = cat.for_instance_type(instance_type)
            keys = [card.key] * n
        else:
            keys = [cat.card(c).key for c in (cards or [])]
        if not keys:
            raise UsageError("a simulated host needs at least one card (cards=[...] or instance_type=...)")
        state_path = Path(state_path)
        state_path.parent.mkdir(parents=True, exist_ok=True)
        root_dir = Path(root) if root is not None else state_path.with_name(state_path.name + ".root")
        host_seed = seed if seed is not None else f"calque-sim/{socket.gethostname()}"
        sim_cards = []
        for i, key in enumerate(keys):
            on = mig and cat.cards[key].mig
            u = uuidlib.uuid5(NS, f"{host_seed}/gpu/{i}")
            sim_cards.append(
                SimCard(
                    index=i,
                    card=key,
                    uuid=f"GPU-{u}",
                    minor=i,
                    mig_current=on,
                    mig_pending=on,
                    persistence_mode=persistence_mode,
                )
            )
        st = SimState(driver_version=driver_version, root=str(root_dir.resolve()), cards=sim_cards)
        sim = cls.__new__(cls)
        sim.state_path = state_path
        sim._file = SimStateFile(state_path)
        with sim._file.locked(exclusive=True):
            if not replace and state_path.exists():
                return sim
            sim._file.save(st)
            sync_files(st)
        return sim

    def state(self) -> SimState:
        """A snapshot of the whole simulated host."""
        with self._file.locked(exclusive=False):
            return self._file.load()

    @contextlib.contextmanager
    def _change(self, driver_call: bool = True) -> Iterator[SimState]:
        with self._file.locked(exclusive=True):
            st = self._file.load()
            if driver_call and not st.privileged:
                raise nv.driver_error(nv.NO_PERMISSION, "insufficient permissions for this GPU change")
            yield st
            self._file.save(st)
            sync_files(st)

    @property
    def root(self) -> Path:
        return Path(self.state().root)

    # -- helpers --------------------------------------------------------------------------------

    @staticmethod
    def _card(st: SimState, index: int) -> SimCard:
        if not 0 <= index < len(st.cards):
            raise nv.driver_error(nv.INVALID_ARGUMENT, f"no GPU with index {index} (this host has {len(st.cards)})")
        return st.cards[index]

    @staticmethod
    def _gi(c: SimCard, gi_id: int) -> SimGpuInstance:
        for gi in c.gis:
            if gi.gi_id == gi_id:
                return gi
        raise nv.driver_error(nv.NOT_FOUND, f"GPU {c.index} has no GPU instance {gi_id}")

    @staticmethod
    def _require_mig(c: SimCard) -> None:
        """MIG calls follow the *current* mode only, as NVML does: nvmlDeviceGetMigMode reports a current
        and a pending mode, and "the pending MIG mode refers to the target mode following the next
        activation trigger" (a reset or reboot; NVML API Reference, Multi Instance GPU Management,
        https://docs.nvidia.com/deploy/nvml-api/group__nvmlMultiInstanceGPU.html). Until then the GPU
        stays in its current mode: instances can be listed, destroyed and created while a disable
        waits, and nothing MIG exists while an enable waits (NOT_SUPPORTED, as the driver answers)."""
        if not c.mig_current:
            pending = " (MIG on is pending a reset)" if c.mig_pending else ""
            raise nv.driver_error(nv.NOT_SUPPORTED, f"GPU {c.index} is not in MIG mode{pending}")

    # -- GpuReader ------------------------------------------------------------------------------

    def gpus(self) -> list[GpuDevice]:
        st = self.state()
        cat = load_catalog()
        return [
            GpuDevice(
                index=c.index,
                name=cat.cards[c.card].nvml_names[0],
                uuid=c.uuid,
                minor=c.minor,
                memory_mib=cat.cards[c.card].memory_mib,
                card=c.card,
                mig_current=c.mig_current,
                mig_pending=c.mig_pending,
                persistence_mode=c.persistence_mode,
                compute_mode=c.compute_mode,
            )
            for c in st.cards
        ]

    def mig_devices(self) -> list[MigDevice]:
        st = self.state()
        return [d for c in st.cards for d in mig_devices_of(c)]

    def processes(self) -> list[GpuProcess]:
        return list(self.state().processes)

    def utilisation(self) -> list[DeviceSample]:
        return sim_samples(self.state())

    # -- GpuBackend -----------------------------------------------------------------------------

    def driver_version(self) -> str:
        return self.state().driver_version

    def gpu_instances(self, index: int) -> list[GpuInstance]:
        st = self.state()
        c = self._card(st, index)
        self._require_mig(c)
        return [gpu_instance_view(c, gi) for gi in sorted(c.gis, key=lambda g: g.start)]

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        with self._change() as st:
            c = self._card(st, index)
            if not catalog_card(c).mig:
                raise nv.driver_error(nv.NOT_SUPPORTED, f"GPU {index} ({c.card}) does not support MIG")
            if not enabled and c.gis:
                raise nv.driver_error(nv.IN_USE, f"GPU {index} still has GPU instances; destroy them first")
            c.mig_pending = enabled

    def reset_gpu(self, index: int) -> None:
        with self._change() as st:
            c = self._card(st, index)
            if not c.reset_supported:
                raise nv.driver_error(nv.NOT_SUPPORTED, f"GPU {index} cannot be reset on this platform; reboot")
            if c.persistence_mode:
                raise nv.driver_error(nv.IN_USE, f"GPU {index} has persistence mode on (nvidia-persistenced)")
            if c.holders:
                raise nv.driver_error(nv.IN_USE, f"GPU {index} is held open by {', '.join(c.holders)}")
            uuids = device_uuids(c)
            busy = sorted(p.pid for p in st.processes if p.device_uuid in uuids)
            if busy:
                raise nv.driver_error(nv.IN_USE, f"GPU {index} has running processes {busy}")
            c.mig_current = c.mig_pending
            c.gis = []  # MIG instances do not survive a reset

    def create_gpu_instance(self, index: int, profile_id: int, start: int) -> GpuInstance:
        with self._change() as st:
            c = self._card(st, index)
            self._require_mig(c)
            card = catalog_card(c)
            p = card.profile_by_id(profile_id)
            if p is None:
                ids = ", ".join(f"{q.profile_id} ({q.name})" for q in card.profiles)
                raise nv.driver_error(
                    nv.INVALID_ARGUMENT, f"{card.key} has no GPU-instance profile id {profile_id}; valid: {ids}"
                )
            if start not in p.placements.starts:
                raise nv.driver_error(
                    nv.INVALID_ARGUMENT,
                    f"{p.name} cannot start at {start} on {card.key} (valid: {p.placements.starts})",
                )
            why = problems(card, [*placed(c), (p, start)])
            if why:
                raise nv.driver_error(
                    nv.INSUFFICIENT_RESOURCES, f"cannot create {p.name} at {start} on GPU {index}: {'; '.join(why)}"
                )
            gi = SimGpuInstance(gi_id=gi_id_for(card, p, start), profile_id=profile_id, start=start)
            c.gis.append(gi)
            return gpu_instance_view(c, gi)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        with self._change() as st:
            c = self._card(st, index)
            self._require_mig(c)
            gi = self._gi(c, gi_id)
            if gi.cis:
                raise nv.driver_error(nv.IN_USE, f"GPU {index} GPU instance {gi_id} still has compute instances")
            c.gis.remove(gi)

    def create_compute_instance(self, index: int, gi_id: int, compute_slices: int) -> int:
        with self._change() as st:
            c = self._card(st, index)
            self._require_mig(c)
            gi = self._gi(c, gi_id)
            p = profile_of(c, gi)
            if compute_slices not in COMPUTE_INSTANCE_PROFILES or compute_slices > p.compute_slices:
                raise nv.driver_error(
                    nv.INVALID_ARGUMENT, f"a {p.name} instance cannot hold a {compute_slices}-slice compute instance"
                )
            if sum(ci.compute_slices for ci in gi.cis) + compute_slices > p.compute_slices:
                raise nv.driver_error(
                    nv.INSUFFICIENT_RESOURCES,
                    f"GPU instance {gi_id} ({p.name}) has no {compute_slices} free compute slices",
                )
            taken = {ci.ci_id for ci in gi.cis}
            ci_id = next(i for i in range(8) if i not in taken)
            gi.cis.append(SimComputeInstance(ci_id=ci_id, compute_slices=compute_slices))
            return ci_id

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        with self._change() as st:
            c = self._card(st, index)
            self._require_mig(c)
            gi = self._gi(c, gi_id)
            ci = next((x for x in gi.cis if x.ci_id == ci_id), None)
            if ci is None:
                raise nv.driver_error(nv.NOT_FOUND, f"GPU {index} GPU instance {gi_id} has no compute instance {ci_id}")
            u = mig_uuid(c, gi, ci)
            busy = sorted(p.pid for p in st.processes if p.device_uuid == u)
            if busy:
                raise nv.driver_error(nv.IN_USE, f"MIG device {u} has running processes {busy}")
            gi.cis.remove(ci)

    def set_compute_mode(self, index: int, mode: str) -> None:
        if mode not in COMPUTE_MODES:
            raise nv.driver_error(nv.INVALID_ARGUMENT, f"compute mode {mode!r}; valid: {', '.join(COMPUTE_MODES)}")
        with self._change() as st:
            self._card(st, index).compute_mode = mode

    def capability_devices(self, mig: MigDevice) -> list[str]:
        with self._file.locked(exclusive=False):
            root = self._file.load().root
            return [str(p) for p in mig_capability_devices(mig, root)]
