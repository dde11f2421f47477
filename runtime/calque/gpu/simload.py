"""The simulator's utilisation: what tests and the sandbox set per device, reported as NVML would.

``calque gpu sim load --device UUID --util 0.0 --memory 2GiB`` sets a device's activity (a MIG
device, a whole GPU, or with ``--pid`` one process on a GPU not in MIG mode: an MPS client). A device
nothing was set on reports unknown activity, as an A100's MIG devices do (no GPM): unknown counts as
active, so the simulator never makes a slice look idle by default. Memory used is what was set, else
the sum of the device's processes' memory.
"""

from __future__ import annotations

from calque.gpu import nvml_errors as nv
from calque.gpu.simstate import SimLoad, SimState, device_uuids, mig_devices_of
from calque.models import DeviceSample
from calque.models.gpu import SampleKind


def process_key(device_uuid: str, pid: int) -> str:
    return f"{device_uuid}/{pid}"


def set_load(
    st: SimState, device_uuid: str, util_percent: float | None, memory_mib: int | None, pid: int | None
) -> None:
    """Set (or, with both None, forget) the load of one device or one process on it."""
    owner = next((c for c in st.cards if device_uuid in device_uuids(c)), None)
    if owner is None:
        raise nv.driver_error(nv.NOT_FOUND, f"no GPU or MIG device {device_uuid} on this host")
    if pid is not None and (owner.mig_current or device_uuid != owner.uuid):
        raise nv.driver_error(
            nv.INVALID_ARGUMENT, "per-process load is for processes on a whole GPU (MPS clients), not on MIG devices"
        )
    key = device_uuid if pid is None else process_key(device_uuid, pid)
    if util_percent is None and memory_mib is None:
        st.load.pop(key, None)
    else:
        st.load[key] = SimLoad(util_percent=util_percent, memory_used_mib=memory_mib)


def _sample(st: SimState, uuid: str, kind: SampleKind, key: str, pid: int | None = None) -> DeviceSample:
    load = st.load.get(key, SimLoad())
    mem = load.memory_used_mib
    if mem is None:
        mem = sum(p.used_memory_mib for p in st.processes if p.device_uuid == uuid and pid in (None, p.pid))
    util = load.util_percent
    return DeviceSample(
        device_uuid=uuid,
        kind=kind,
        pid=pid,
        sm_percent=util,
        graphics_percent=util,
        memory_used_mib=mem,
        source="sim" if util is not None else "none",
    )


def sim_samples(st: SimState) -> list[DeviceSample]:
    """Every GPU, every MIG device, and every process on a GPU not in MIG mode."""
    out = []
    for c in st.cards:
        out.append(_sample(st, c.uuid, "gpu", c.uuid))
        if c.mig_current:
            out += [_sample(st, d.uuid, "mig", d.uuid) for d in mig_devices_of(c)]
        else:
            procs = sorted({p.pid for p in st.processes if p.device_uuid == c.uuid})
            out += [_sample(st, c.uuid, "process", process_key(c.uuid, pid), pid) for pid in procs]
    return out
