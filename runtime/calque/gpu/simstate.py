"""The simulated host's state: its models, the locked state file, and the views derived from it.

``calque.gpu.sim.SimGpu`` (the driver calls and test controls) works on these. The state file is
read under an ``fcntl`` lock and replaced atomically (temporary file + rename), so separate
processes (a module run, the session daemon, a worker) share one machine. ``sync_files`` writes the
capability files a driver publishes for each MIG device under the simulator's root.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

from pydantic import Field

from calque.errors import InfrastructureError, RefusedError
from calque.gpu.caps import access_file_text, cap_minor, proc_access_files
from calque.gpu.catalog import Card, GiProfile, load_catalog
from calque.gpu.placement import Placed
from calque.models import ComputeInstance, GpuInstance, GpuProcess, MigDevice
from calque.models.base import CalqueModel

SIM_STATE_VERSION = 1
DEFAULT_DRIVER_VERSION = "595.91.07"
NS = uuidlib.UUID("5b0c1d7e-4a52-4d0b-9d4e-63616c717565")


class SimComputeInstance(CalqueModel):
    ci_id: int = Field(ge=0)
    compute_slices: int = Field(ge=1)


class SimGpuInstance(CalqueModel):
    gi_id: int = Field(ge=0)
    profile_id: int = Field(ge=0)
    start: int = Field(ge=0)
    cis: list[SimComputeInstance] = Field(default_factory=list)


class SimCard(CalqueModel):
    index: int = Field(ge=0)
    card: str = Field(description="catalog key")
    uuid: str
    minor: int = Field(ge=0)
    mig_current: bool = False
    mig_pending: bool = False
    persistence_mode: bool = False
    compute_mode: str = "DEFAULT"
    reset_supported: bool = Field(True, description="False: the platform cannot reset this GPU; reboot instead")
    holders: list[str] = Field(default_factory=list, description="kernel clients holding the GPU, e.g. nvidia_drm")
    gis: list[SimGpuInstance] = Field(default_factory=list)


class SimLoad(CalqueModel):
    """What ``calque gpu sim load`` set on one device (or one process on it): None is unknown."""

    util_percent: float | None = Field(None, ge=0, le=100)
    memory_used_mib: int | None = Field(None, ge=0)


class SimState(CalqueModel):
    """The whole simulated host, as stored in the state file."""

    version: int = SIM_STATE_VERSION
    driver_version: str = DEFAULT_DRIVER_VERSION
    root: str = Field(description="directory standing in for / (proc and dev files)")
    privileged: bool = Field(True, description="False: changes fail with NVML_ERROR_NO_PERMISSION")
    cards: list[SimCard]
    processes: list[GpuProcess] = Field(default_factory=list)
    load: dict[str, SimLoad] = Field(
        default_factory=dict, description="by device UUID, or UUID/pid for one process: see calque.gpu.simload"
    )


def gi_id_for(card: Card, p: GiProfile, start: int) -> int:
    """The driver's fixed GI id per (size, start): 0 for the whole card, then larger sizes first."""
    offset = 0
    for size in sorted({q.placements.size for q in card.profiles}, reverse=True):
        if size == p.placements.size:
            return offset + start // size
        offset += max(1, card.placement_units // size)
    return offset  # pragma: no cover - every profile's size is in the set


class SimStateFile:
    """The state file of one simulated host, read and replaced under its lock file."""

    def __init__(self, state_path: Path) -> None:
        self.state_path = state_path
        self._lock_path = state_path.with_name(state_path.name + ".lock")

    @contextlib.contextmanager
    def locked(self, exclusive: bool) -> Iterator[None]:
        # A reader needs no write access (flock works on a read-only descriptor): a user may read a
        # host that root laid out, as nvidia-smi lets any user read a real one.
        try:
            fd = os.open(
                self._lock_path,
                os.O_RDONLY if not exclusive and self._lock_path.exists() else os.O_RDWR | os.O_CREAT,
                0o666,
            )
        except PermissionError as exc:
            raise RefusedError(
                f"cannot {'change' if exclusive else 'read'} the simulated GPU host at {self.state_path}: permission "
                f"denied on {exc.filename}; run this as root (or as the user who created it)"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def load(self) -> SimState:
        try:
            doc = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InfrastructureError(f"cannot read simulated GPU state {self.state_path}: {exc}") from exc
        if doc.get("version") != SIM_STATE_VERSION:
            raise InfrastructureError(
                f"{self.state_path} has simulator state version {doc.get('version')!r}; "
                f"this runtime reads {SIM_STATE_VERSION}: recreate it"
            )
        return SimState.model_validate(doc)

    def save(self, st: SimState) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.state_path.parent, prefix=self.state_path.name + ".")
        try:
            os.fchmod(fd, 0o644)  # readable by every user, as a real GPU's state is (mkstemp makes it 0600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(st.model_dump_json(indent=1))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.state_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def mig_uuid(c: SimCard, gi: SimGpuInstance, ci: SimComputeInstance) -> str:
    u = uuidlib.uuid5(NS, f"{c.uuid}/{gi.gi_id}/{ci.ci_id}/{gi.profile_id}/{gi.start}/{ci.compute_slices}")
    return f"MIG-{u}"


def catalog_card(c: SimCard) -> Card:
    return load_catalog().cards[c.card]


def profile_of(c: SimCard, gi: SimGpuInstance) -> GiProfile:
    p = catalog_card(c).profile_by_id(gi.profile_id)
    assert p is not None  # only valid ids are ever stored
    return p


def placed(c: SimCard) -> list[Placed]:
    return [(profile_of(c, gi), gi.start) for gi in c.gis]


def device_uuids(c: SimCard) -> set[str]:
    out = {c.uuid}
    for gi in c.gis:
        out |= {mig_uuid(c, gi, ci) for ci in gi.cis}
    return out


def mig_devices_of(c: SimCard) -> list[MigDevice]:
    if not c.mig_current:
        return []
    card = catalog_card(c)
    out = []
    for gi in sorted(c.gis, key=lambda g: g.start):
        p = profile_of(c, gi)
        sms = card.profile_sms(p)
        for ci in sorted(gi.cis, key=lambda x: x.ci_id):
            split = ci.compute_slices < p.compute_slices
            out.append(
                MigDevice(
                    gpu_index=c.index,
                    gpu_uuid=c.uuid,
                    gpu_minor=c.minor,
                    profile=p.name,
                    profile_id=p.profile_id,
                    placement_start=gi.start,
                    placement_size=p.placements.size,
                    gi_id=gi.gi_id,
                    ci_id=ci.ci_id,
                    ci_profile=f"{ci.compute_slices}c.{p.name}" if split else None,
                    uuid=mig_uuid(c, gi, ci),
                    memory_mib=card.profile_memory_mib(p),
                    sms=None if sms is None else sms * ci.compute_slices // p.compute_slices,
                )
            )
    return out


def gpu_instance_view(c: SimCard, gi: SimGpuInstance) -> GpuInstance:
    p = profile_of(c, gi)
    cis = [
        ComputeInstance(
            ci_id=ci.ci_id,
            compute_slices=ci.compute_slices,
            profile=f"{ci.compute_slices}c.{p.name}" if ci.compute_slices < p.compute_slices else None,
            uuid=mig_uuid(c, gi, ci),
        )
        for ci in sorted(gi.cis, key=lambda x: x.ci_id)
    ]
    return GpuInstance(
        gpu_index=c.index,
        gi_id=gi.gi_id,
        profile=p.name,
        profile_id=p.profile_id,
        placement_start=gi.start,
        placement_size=p.placements.size,
        compute_instances=cis,
    )


def sync_files(st: SimState) -> None:
    """Write the driver's capability files for every MIG device; remove those of destroyed ones."""
    root = Path(st.root)
    capdir = root / "proc/driver/nvidia/capabilities"
    devdir = root / "dev/nvidia-caps"
    want: dict[Path, str] = {
        capdir / "mig/config": access_file_text(1).replace("292", "256"),
        capdir / "mig/monitor": access_file_text(2),
    }
    nodes = {devdir / "nvidia-cap1", devdir / "nvidia-cap2"}
    for c in st.cards:
        if not c.mig_current:
            continue
        for gi in c.gis:
            for ci in gi.cis:
                gi_file, ci_file = proc_access_files(root, c.minor, gi.gi_id, ci.ci_id)
                for f, minor in (
                    (gi_file, cap_minor(c.minor, gi.gi_id)),
                    (ci_file, cap_minor(c.minor, gi.gi_id, ci.ci_id)),
                ):
                    want[f] = access_file_text(minor)
                    nodes.add(devdir / f"nvidia-cap{minor}")
            if not gi.cis:
                gi_file, _ = proc_access_files(root, c.minor, gi.gi_id, 0)
                want[gi_file] = access_file_text(cap_minor(c.minor, gi.gi_id))
                nodes.add(devdir / f"nvidia-cap{cap_minor(c.minor, gi.gi_id)}")
    for f, text in want.items():
        f.parent.mkdir(parents=True, exist_ok=True)
        if not f.exists() or f.read_text() != text:
            f.write_text(text)
    devdir.mkdir(parents=True, exist_ok=True)
    for n in nodes:
        if not n.exists():
            n.touch(mode=0o444)
    for f in capdir.glob("gpu*/mig/gi*/**/access"):
        if f not in want:
            f.unlink()
    for d in sorted(capdir.glob("gpu*/mig/gi*/**"), key=lambda p: len(p.parts), reverse=True):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    for n in devdir.glob("nvidia-cap*"):
        if n not in nodes:
            n.unlink()
