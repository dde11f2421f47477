"""``calque gpu ...``: the GPU catalog, facts, MIG layouts and MPS daemons on this host."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from calque.cli.gpu_request import open_backend, progress, request_backend
from calque.cli.options import gpu_backend_options, json_option, shared_gpu_consent_option
from calque.cli.outcome_view import emit_outcome
from calque.cli.output import emit, table
from calque.errors import PartialFailure
from calque.gpu.catalog import Catalog, load_catalog
from calque.gpu.facts import HostGpuFacts, gather
from calque.gpu.mps_control import DEFAULT_LOG_ROOT, DEFAULT_PIPE_ROOT, MpsControl
from calque.gpu.mps_units import MpsUnits, mps_units
from calque.gpu.nvml import NvmlBackend
from calque.gpu.selection import GpuSelection
from calque.gpu.verify import VerifyReport
from calque.gpu.verify import verify as verify_host
from calque.models.mps import MpsStatus
from calque.ops.mps import MpsDaemonsOp, MpsRequest
from calque.ops.outcome import Outcome


@click.group()
def gpu() -> None:
    """Inspect GPUs, lay out MIG slices and run MPS daemons on this host."""


def _render_catalog(cat: Catalog) -> str:
    parts = [
        table(
            ["family", "card", "sharing", "GPUs per size"],
            [
                [
                    f + (" ?" if fam.uncertain else ""),
                    fam.card,
                    fam.sharing,
                    " ".join(f"{s}:{n}" for s, n in fam.sizes.items()),
                ]
                for f, fam in cat.ec2_families.items()
            ],
        )
    ]
    for key, card in cat.cards.items():
        head = f"\n{key} ({card.nvml_names[0]}, {card.memory_mib} MiB, " + (
            f"MIG: max {card.max_instances} instances on a {card.placement_units}-slice grid)"
            if card.mig
            else "no MIG)"
        )
        parts.append(head)
        if card.profiles:
            parts.append(
                table(
                    ["profile", "id", "g", "slices", "max", "starts", "SMs", "uncertain"],
                    [
                        [
                            p.name,
                            p.profile_id,
                            p.compute_slices,
                            p.memory_slices,
                            p.max_count,
                            ",".join(map(str, p.placements.starts)),
                            p.sms,
                            ",".join(p.uncertain),
                        ]
                        for p in card.profiles
                    ],
                )
            )
    return "\n".join(parts)


@gpu.command()
@click.option("--card", default=None, help="Show only this card (catalog key or NVML name).")
@json_option
def catalog(card: str | None, as_json: bool) -> None:
    """Show the GPU catalog: cards, MIG profiles and EC2 families (`?` marks inferred values)."""
    cat = load_catalog()
    if card is not None:
        c = cat.card(card)
        cat = cat.model_copy(
            update={
                "cards": {c.key: c},
                "ec2_families": {f: fam for f, fam in cat.ec2_families.items() if fam.card == c.key},
            }
        )
    emit(cat, as_json, _render_catalog)


def _render_verify(r: VerifyReport) -> str:
    lines = [f"driver {r.driver_version}"]
    for g in r.gpus:
        mig = "MIG on" if g.mig_current else ("no MIG" if g.mig_supported is False else "MIG off")
        lines.append(
            f"GPU {g.index}: {g.name} ({g.card or 'not in catalog'}, {g.memory_mib} MiB, {mig}, "
            f"{g.profiles_checked} profiles compared)"
        )
        lines += [f"  note: {n}" for n in g.notes]
        if g.confirmed:
            lines.append(f"  confirmed (marked uncertain in the catalog): {', '.join(g.confirmed)}")
    if r.differences:
        lines.append("")
        lines.append(
            table(
                ["gpu", "card", "profile", "field", "catalog", "driver", "catalog marked uncertain"],
                [
                    [d.gpu_index, d.card, d.profile or "-", d.field, d.catalog, d.driver, "yes" if d.uncertain else ""]
                    for d in r.differences
                ],
            )
        )
    lines.append("")
    unsure = sum(d.uncertain for d in r.differences)
    lines.append(
        f"{len(r.differences)} difference(s) between the catalog and the cards "
        f"({unsure} on values the catalog marks uncertain)"
        if r.differences
        else "the catalog matches every card"
    )
    return "\n".join(lines)


@gpu.command()
@click.option("--strict", is_flag=True, help="Exit 1 when any difference is found.")
@json_option
def verify(strict: bool, as_json: bool) -> None:
    """Compare the catalog with what NVML reports on this host's cards (read-only).

    Needs the NVIDIA driver; exits 3 when there is none. Only reads: names, memory, MIG mode,
    GPU-instance profiles and their possible placements (profiles only while MIG mode is on).
    """
    with NvmlBackend() as backend:
        report = verify_host(backend)
    emit(report, as_json, _render_verify)
    if strict and report.differences:
        raise PartialFailure(f"{len(report.differences)} difference(s) between the catalog and the cards")


@gpu.group()
def mps() -> None:
    """MPS control daemons for cooperative GPU sharing (no isolation between clients)."""


def _gpu_list(value: str | None) -> list[int] | None:
    if value is None or value == "all":
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: give GPU indices like 0,1 or all", param_hint="--gpus") from None


def _mps_options(f: Callable[..., None]) -> Callable[..., None]:
    for opt in (
        click.option("--gpus", default=None, help="GPU indices, e.g. 0,2 (default: all)."),
        click.option("--per-mig", is_flag=True, help="One daemon per MIG device instead of per GPU."),
        click.option("--pipe-root", default=str(DEFAULT_PIPE_ROOT), show_default=True, help="Pipe directories root."),
        click.option("--log-root", default=str(DEFAULT_LOG_ROOT), show_default=True, help="Log directories root."),
        json_option,
    ):
        f = opt(f)
    return gpu_backend_options(f)


def _render_mps_status(s: MpsStatus) -> str:
    rows = [
        [d.target, d.gpu_index, "running" if d.running else "stopped", d.active_thread_percentage or "-",
         d.pinned_memory_limit or "-", d.compute_mode or "-", d.pipe_dir]
        for d in s.daemons
    ]  # fmt: skip
    out = table(["daemon", "gpu", "state", "threads %", "pinned limit", "compute mode", "pipe dir"], rows)
    if s.user_model:
        out += f"\nusers: {s.user_model.mode} ({s.user_model.evidence}); {s.user_model.slot_policy}"
    return out


def _render_mps_daemons(o: Outcome[Any]) -> str:
    return _render_mps_status(MpsStatus(daemons=o.result.daemons))


def _mps_run(
    state: str,
    check: bool,
    consent: bool,
    *,  # then _mps_options' values, as start and stop receive them
    gpus: str | None,
    per_mig: bool,
    pipe_root: str,
    log_root: str,
    gpu: GpuSelection,
    as_json: bool,
    **limits: Any,
) -> None:
    request = MpsRequest(
        state=state,
        gpus=_gpu_list(gpus),
        per_mig=per_mig,
        pipe_root=pipe_root,
        log_root=log_root,
        **request_backend(gpu),
        i_understand_shared_gpu_has_no_isolation=consent,
        **limits,
    )
    emit_outcome(MpsDaemonsOp(progress=progress).run(request, check_mode=check), as_json, _render_mps_daemons)


@mps.command("status")
@_mps_options
def mps_status(
    gpus: str | None, per_mig: bool, pipe_root: str, log_root: str, gpu: GpuSelection, as_json: bool
) -> None:
    """Show each MPS control daemon, its limits and the GPU's compute mode."""
    ctl = MpsControl(open_backend(gpu), pipe_root=pipe_root, log_root=log_root)
    emit(ctl.status(_gpu_list(gpus), per_mig), as_json, _render_mps_status)


@mps.command("start")
@click.option("--active-thread-percentage", type=click.IntRange(1, 100), default=None, help="Default client SM share.")
@click.option("--pinned-memory-limit", default=None, help="Default per-client pinned device memory, e.g. 8G.")
@click.option("--check", is_flag=True, help="Show what would change, change nothing.")
@shared_gpu_consent_option
@_mps_options
def mps_start(
    active_thread_percentage: int | None,
    pinned_memory_limit: str | None,
    check: bool,
    shared_gpu_consent: bool,
    **where: Any,  # _mps_options' values
) -> None:
    """Start one MPS control daemon per GPU (EXCLUSIVE_PROCESS mode) with default client limits."""
    limits: dict[str, Any] = {
        "active_thread_percentage": active_thread_percentage,
        "pinned_memory_limit": pinned_memory_limit,
    }
    _mps_run("started", check, shared_gpu_consent, **where, **limits)


@mps.command("stop")
@click.option("--check", is_flag=True, help="Show what would change, change nothing.")
@shared_gpu_consent_option
@_mps_options
def mps_stop(check: bool, shared_gpu_consent: bool, **where: Any) -> None:
    """Stop the MPS control daemons and put their GPUs back in DEFAULT compute mode."""
    _mps_run("stopped", check, shared_gpu_consent, **where)


def _render_units(u: MpsUnits) -> str:
    # One file per unit: each starts with the path it belongs at, so the output can be split by hand.
    return "\n".join(f"# ==> /etc/systemd/system/{name}\n{text}" for name, text in u.units.items())


@mps.command("unit")
@click.option(
    "--calque",
    "calque_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Absolute path of calque for ExecStart (default: the calque beside this Python, e.g. <venv>/bin/calque).",
)
@json_option
def mps_unit(calque_path: str | None, as_json: bool) -> None:
    """Print the systemd units (calque-mps@.service, calque-mps.target) that run a daemon per GPU at boot."""
    emit(mps_units(calque_path), as_json, _render_units)


def _render_facts(f: HostGpuFacts) -> str:
    lines = [f"backend {f.backend}, driver {f.driver_version}"]
    for g in f.gpus:
        d = g.gpu
        mig = "MIG on" if d.mig_current else "MIG off"
        if d.mig_pending != d.mig_current:
            mig += f" (pending {'on' if d.mig_pending else 'off'})"
        lines.append(
            f"GPU {d.index}: {d.name} {d.uuid} {d.memory_mib} MiB, {mig}, compute mode {d.compute_mode}"
            + (f", catalog {g.catalog.key}" if g.catalog else ", not in catalog")
        )
        for m in g.mig_devices:
            busy = [p.pid for p in g.processes if p.device_uuid == m.uuid]
            lines.append(
                f"  {m.ci_profile or m.profile}@{m.placement_start} GI {m.gi_id} CI {m.ci_id} {m.uuid}"
                + (f" pids {busy}" if busy else "")
            )
        direct = [p.pid for p in g.processes if p.device_uuid == d.uuid]
        if direct:
            lines.append(f"  pids {direct}")
    if f.mps is not None:
        running = [d.target for d in f.mps.daemons if d.running]
        lines.append(f"MPS daemons running: {', '.join(running) or 'none'}")
    return "\n".join(lines)


@gpu.command()
@click.option("--pipe-root", default=str(DEFAULT_PIPE_ROOT), show_default=True, help="MPS pipe directories root.")
@click.option("--log-root", default=str(DEFAULT_LOG_ROOT), show_default=True, help="MPS log directories root.")
@gpu_backend_options
@json_option
def info(pipe_root: str, log_root: str, gpu: GpuSelection, as_json: bool) -> None:
    """Show GPUs, MIG instances and devices, processes, MPS daemons and each card's catalog entry."""
    backend = open_backend(gpu)
    emit(gather(backend, MpsControl(backend, pipe_root=pipe_root, log_root=log_root)), as_json, _render_facts)


# `calque gpu sim ...` and `calque gpu mig ...` live in their own files (cli/gpu_sim.py, cli/gpu_mig.py).
from calque.cli.gpu_mig import mig  # noqa: E402
from calque.cli.gpu_sim import sim  # noqa: E402

gpu.add_command(mig)
gpu.add_command(sim)
