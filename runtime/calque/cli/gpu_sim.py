"""``calque gpu sim ...``: make a simulated GPU host and act on it by hand, to try layouts safely.

Thin over ``calque.gpu.sim.SimGpu``: every command opens the state file the shared backend flags
name (``--sim-state PATH``, or the host configuration's ``gpu.sim.state``), so ``calque gpu mig
plan|apply``, ``calque gpu info`` and the session daemon see the same simulated machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from calque.cli.options import gpu_backend_options, json_option
from calque.cli.output import emit, table
from calque.errors import UsageError

if TYPE_CHECKING:
    from calque.gpu.selection import GpuSelection
    from calque.gpu.sim import SimGpu
    from calque.gpu.simstate import SimState


def _sim(gpu: GpuSelection) -> SimGpu:
    from calque.gpu.selection import sim_state_path
    from calque.gpu.sim import SimGpu

    return SimGpu(sim_state_path(gpu))


@click.group()
def sim() -> None:
    """A simulated GPU host: create one, put processes on its devices, reboot it.

    Then try layouts on it with `calque gpu mig plan|apply --sim-state PATH` (or point the host
    configuration at it), exactly as on a real host.
    """


def _render_state(st: SimState) -> str:
    from calque.gpu.simstate import mig_devices_of

    lines = [
        f"simulated host, driver {st.driver_version}, root {st.root}" + ("" if st.privileged else ", unprivileged")
    ]
    rows = []
    for c in st.cards:
        mode = "on" if c.mig_current else "off"
        if c.mig_pending != c.mig_current:
            mode += f" (pending {'on' if c.mig_pending else 'off'})"
        holds = ", ".join([*(["persistence"] if c.persistence_mode else []), *c.holders]) or "-"
        rows.append([c.index, c.card, mode, holds, c.uuid])
        for d in mig_devices_of(c):
            rows.append(
                ["", f"  {d.ci_profile or d.profile}@{d.placement_start}", f"GI {d.gi_id} CI {d.ci_id}", "", d.uuid]
            )
    lines.append(table(["gpu", "card / MIG device", "MIG", "held by", "uuid"], rows))
    if st.processes:
        lines.append("")
        lines.append(table(["pid", "MiB", "device"], [[p.pid, p.used_memory_mib, p.device_uuid] for p in st.processes]))
    if st.load:
        lines.append("")
        loads = [
            [k, _pct(v.util_percent), "-" if v.memory_used_mib is None else v.memory_used_mib]
            for k, v in st.load.items()
        ]
        lines.append(table(["load on", "activity", "MiB used"], sorted(loads)))
    return "\n".join(lines)


def _pct(v: float | None) -> str:
    return "unknown" if v is None else f"{v:g}%"


@sim.command("create")
@click.option("--card", "cards", multiple=True, help="A catalog card per GPU, e.g. --card A100-40GB --card A100-40GB.")
@click.option("--instance-type", default=None, help="Or an EC2 instance type's GPUs, e.g. p4d.24xlarge.")
@click.option("--mig", is_flag=True, help="Start MIG-capable cards with MIG mode on.")
@click.option("--replace", is_flag=True, help="Replace an existing simulated host at that path.")
@gpu_backend_options
@json_option
def sim_create(
    cards: tuple[str, ...], instance_type: str | None, mig: bool, replace: bool, gpu: GpuSelection, as_json: bool
) -> None:
    """Create a simulated host at --sim-state (cards from `calque gpu catalog`)."""
    from calque.gpu.selection import sim_state_path
    from calque.gpu.sim import SimGpu

    path = sim_state_path(gpu)
    if path.exists() and not replace:
        raise UsageError(f"{path} already holds a simulated host; pass --replace to start over")
    made = SimGpu.create(path, list(cards) or None, instance_type=instance_type, mig=mig)
    emit(made.state(), as_json, _render_state)


@sim.command("show")
@gpu_backend_options
@json_option
def sim_show(gpu: GpuSelection, as_json: bool) -> None:
    """Show the simulated host: cards, MIG mode (current and pending), MIG devices, processes."""
    emit(_sim(gpu).state(), as_json, _render_state)


def _device_uuid(s: SimGpu, device: str) -> str:
    """A GPU index, a GPU-... or MIG-... UUID, or GPU:profile@start (the first CI of that instance)."""
    if device.isdigit():
        return next((g.uuid for g in s.gpus() if g.index == int(device)), device)
    if ":" in device and "@" in device:
        index, where = device.split(":", 1)
        profile, start = where.rsplit("@", 1)
        for d in s.mig_devices():
            if str(d.gpu_index) == index and d.profile == profile and str(d.placement_start) == start:
                return d.uuid
        raise UsageError(f"GPU {index} has no {profile} instance at {start}; see `calque gpu sim show`")
    return device


@sim.command("add-process")
@click.argument("device")
@click.option("--pid", type=int, required=True, help="The process id to show on the device.")
@click.option("--memory", "memory_mib", type=int, default=0, show_default=True, help="Its GPU memory, MiB.")
@gpu_backend_options
@json_option
def sim_add_process(device: str, pid: int, memory_mib: int, gpu: GpuSelection, as_json: bool) -> None:
    """Put a process on a device: a GPU index, a UUID, or GPU:profile@start (e.g. 0:3g.20gb@4).

    A busy MIG instance is what `calque gpu mig apply` refuses to destroy without --force.
    """
    s = _sim(gpu)
    s.add_process(_device_uuid(s, device), pid, used_memory_mib=memory_mib)
    emit(s.state(), as_json, _render_state)


@sim.command("load")
@click.option("--device", required=True, help="A GPU index, a GPU-/MIG- UUID, or GPU:profile@start.")
@click.option("--util", default=None, help="Its activity: a fraction (0.0) or a percentage (35%); 'unknown' clears it.")
@click.option("--memory", default=None, help="Memory in use, e.g. 2GiB or 512MiB (default: its processes' memory).")
@click.option("--pid", type=int, default=None, help="Only this process on a GPU not in MIG mode (an MPS client).")
@gpu_backend_options
@json_option
def sim_load(
    device: str, util: str | None, memory: str | None, pid: int | None, gpu: GpuSelection, as_json: bool
) -> None:
    """Make a device busy or idle, as NVML would measure it (`calque session` idle reclaim reads it).

    A device nothing was set on reports unknown activity (as an A100's MIG devices do), and unknown
    counts as active: `--util unknown` puts a device back to that.
    """
    from calque.quantities import parse_mib, parse_percent

    s = _sim(gpu)
    pct = None if util in (None, "unknown") else parse_percent(util, what="--util")
    mib = None if memory is None else parse_mib(memory, what="--memory")
    if util is None and memory is None:
        raise UsageError("give --util, --memory or both (--util unknown forgets the device's load)")
    s.set_load(_device_uuid(s, device), pct, mib, pid)
    emit(s.state(), as_json, _render_state)


@sim.command("remove-process")
@click.option("--pid", type=int, default=None, help="Only this process (default: every process).")
@gpu_backend_options
@json_option
def sim_remove_process(pid: int | None, gpu: GpuSelection, as_json: bool) -> None:
    """Let processes exit: one (--pid) or all of them."""
    s = _sim(gpu)
    if pid is None:
        s.clear_processes()
    else:
        gone = [p for p in s.processes() if p.pid == pid]
        if not gone:
            raise UsageError(f"no process {pid} on the simulated host; see `calque gpu sim show`")
        s.stop_processes(gone)
    emit(s.state(), as_json, _render_state)


@sim.command("persistence")
@click.argument("index", type=int)
@click.argument("mode", type=click.Choice(["on", "off"]))
@gpu_backend_options
@json_option
def sim_persistence(index: int, mode: str, gpu: GpuSelection, as_json: bool) -> None:
    """Turn a GPU's persistence mode on or off (on blocks a GPU reset, as nvidia-persistenced does)."""
    s = _sim(gpu)
    s.set_persistence_mode(index, mode == "on")
    emit(s.state(), as_json, _render_state)


@sim.command("reboot")
@gpu_backend_options
@json_option
def sim_reboot(gpu: GpuSelection, as_json: bool) -> None:
    """Reboot the simulated host: pending MIG modes become current; instances and processes are gone."""
    s = _sim(gpu)
    s.reboot()
    emit(s.state(), as_json, _render_state)
