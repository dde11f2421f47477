"""Whether a held slice is active, from every reading the GPU backend gives: the idle rule on its own.

The utilisation is read first, and whose processes run on the slice never decides before it does: work
the holder runs as root in a container is on the slice as much as her own. A MIG slice is **active**
when any reading says so: its engine activity (GPM) at or above ``below`` (and above 0 %), device
memory in use on that MIG device or by any process of any uid on it at or above ``memory_from``, or,
its engine activity being unknown, any process on it at all (or no reading of it at all). An MPS slot
is not a device of its own, so it is its holder's clients' (processes of the holder's uid on the GPU):
active when a client's own use is at or above ``below``, when a client has no per-process sample
(unknown, never 0 %), or when the clients hold ``memory_from`` of memory. Everything else is idle: a
MIG device nobody runs on and that holds no memory, whatever its engines say; a slot with no client.
"""

from __future__ import annotations

from dataclasses import dataclass

from calque.models import DeviceSample, GpuProcess
from calque.session.daemon.rows import Held
from calque.session.session_config import IdlePolicy


@dataclass(frozen=True)
class Reading:
    """What the readings say about one slice, and which reading said it (for the log and the audit)."""

    active: bool
    why: str


def _busy(pct: float | None, below: float) -> bool:
    """A measured activity that counts: never 0 %, which is no activity whatever ``below`` is."""
    return pct is not None and pct > 0 and pct >= below


def mig_reading(h: Held, procs: list[GpuProcess], samples: list[DeviceSample], policy: IdlePolicy) -> Reading:
    uuid = h.slice.mig_uuid
    dev = next((s for s in samples if s.kind == "mig" and s.device_uuid == uuid), None)
    on = [p for p in procs if p.device_uuid == uuid]  # any uid: root's work in a container counts as much
    engine = dev.active_percent if dev is not None else None
    if _busy(engine, policy.below):
        return Reading(True, f"engine activity {engine:g}%")
    if policy.memory_from is not None:
        dev_mem = dev.memory_used_mib if dev is not None else None
        used = max(dev_mem or 0, sum(p.used_memory_mib for p in on))
        if used >= policy.memory_from:
            return Reading(True, f"{used} MiB of device memory in use")
        if dev is not None and dev_mem is None:
            return Reading(True, "device memory in use unknown")
    if engine is None:
        if dev is None:
            return Reading(True, "no reading of the device")
        if on:
            pids = ", ".join(str(p.pid) for p in on)
            return Reading(True, f"engine activity unknown with process {pids} on it")
        return Reading(False, "no process and no memory in use on it")
    return Reading(False, f"engine activity {engine:g}% (below {policy.below:g}%), {len(on)} process(es) on it")


def mps_reading(
    h: Held, clients: list[int], procs: list[GpuProcess], samples: list[DeviceSample], policy: IdlePolicy
) -> Reading:
    """``clients``: the holder's live processes on the slot's GPU."""
    gpu = h.slice.gpu_uuid
    if not clients:
        return Reading(False, "no client of the holder on the GPU")
    own = {s.pid: s for s in samples if s.kind == "process" and s.device_uuid == gpu and s.pid in clients}
    for pid in clients:
        got = own.get(pid)
        pct = got.active_percent if got is not None else None
        if pct is None:  # no per-process sample (or none measured): unknown, never 0 %
            return Reading(True, f"client {pid}'s own use is unknown")
        if _busy(pct, policy.below):
            return Reading(True, f"client {pid} at {pct:g}%")
    if policy.memory_from is not None:
        listed = {p.pid: p.used_memory_mib for p in procs if p.device_uuid == gpu and p.pid in clients}
        used = sum(max(listed.get(pid, 0), own[pid].memory_used_mib or 0) for pid in clients)
        if used >= policy.memory_from:
            return Reading(True, f"{used} MiB of device memory held by the holder's clients")
    return Reading(False, f"{len(clients)} client(s), each below {policy.below:g}%")


def slice_reading(
    h: Held, clients: list[int], procs: list[GpuProcess], samples: list[DeviceSample], policy: IdlePolicy
) -> Reading:
    """The slice's reading; ``clients`` (the holder's live processes on it) matter for an MPS slot only."""
    if h.slice.kind == "mig":
        return mig_reading(h, procs, samples, policy)
    return mps_reading(h, clients, procs, samples, policy)
