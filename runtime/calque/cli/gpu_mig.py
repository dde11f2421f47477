"""``calque gpu mig ...``: show the MIG layout, plan a change (with the sessions and processes it ends
first), apply it, suggest one from the session registry's demand; part of the ``calque gpu`` group."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import click

from calque.cli.gpu_request import open_backend, progress, request_backend
from calque.cli.options import DURATION, gpu_backend_options, json_option, session_socket_option
from calque.cli.outcome_view import emit_outcome
from calque.cli.output import emit, table
from calque.errors import RefusedError, UsageError
from calque.gpu.migmodels import MigSuggestion
from calque.gpu.planner import MigState, current_layout
from calque.gpu.selection import GpuSelection
from calque.ops.mig import MigLayoutOp, MigRequest, MigResult
from calque.ops.outcome import Failure, Outcome


@click.group()
def mig() -> None:
    """Declarative MIG layouts: show the current one, plan a change, apply it."""


def _render_state(s: MigState) -> str:
    rows = []
    for g in s.gpus:
        mode = "on" if g.mig_current else "off"
        if g.mig_pending != g.mig_current:
            mode += f" (pending {'on' if g.mig_pending else 'off'}: reset needed)"
        rows.append([g.index, g.card or g.name, mode, " ".join(g.layout.instances) or "-"])
    return table(["gpu", "card", "MIG", "instances (profile@start [CI split])"], rows)


def _render_layouts(o: Outcome[Any]) -> str:
    """Each selected GPU's layout before and after (planned, in check mode; as asked for, where the real run
    would be refused), then its MIG devices."""

    def shown(view: dict[str, Any] | None) -> str:
        if not view:
            return "-"
        text = " ".join(view["instances"]) or ("MIG on, empty" if view["mig_enabled"] else "MIG off")
        if view.get("mig_pending") is not None:
            text += f" (MIG {'on' if view['mig_pending'] else 'off'} pending a reset)"
        return text

    if not o.after:
        return "the layout selects no GPU on this host"
    if o.check_mode and o.result.refusal is not None:
        asked = o.result.requested
        return "\n".join(
            f"{gpu}: {shown(o.before.get(gpu))}  ->  {shown(view)}  (asked for)" for gpu, view in asked.items()
        )
    lines = [f"{gpu}: {shown(o.before.get(gpu))}  ->  {shown(view)}" for gpu, view in o.after.items()]
    devices = o.result.mig_devices
    if devices and not o.check_mode:
        rows = [[d.gpu_index, d.ci_profile or d.profile, d.placement_start, d.gi_id, d.ci_id, d.uuid] for d in devices]
        lines += ["", table(["gpu", "profile", "start", "gi", "ci", "uuid"], rows)]
    return "\n".join(lines)


@mig.command("show")
@gpu_backend_options
@json_option
def mig_show(gpu: GpuSelection, as_json: bool) -> None:
    """Show every GPU's MIG mode and instances."""
    emit(current_layout(open_backend(gpu)), as_json, _render_state)


config_option = click.option(
    "--config", "config_file", required=True, type=click.Path(exists=True, dir_okay=False), help="Layout file (YAML)."
)
select_option = click.option(
    "--select", default=None, help="Name of the config in the file (needed when it has several)."
)
force_option = click.option(
    "--force", is_flag=True, help="Destroy busy instances: end their sessions (reason layout), stop their processes."
)

drain_option = click.option(
    "--drain-wait",
    type=DURATION,
    default=None,
    help="Drain the GPUs the layout changes first (undrained after) and let sessions on slices it destroys "
    "run out for this long, e.g. 2h (ended then only with --force).",
)


def _mig_request(
    config_file: str,
    select: str | None,
    force: bool,
    allow_reset: bool,
    gpu: GpuSelection,
    socket: str | None,
    drain_wait: float | None = None,
) -> MigRequest:
    return MigRequest(
        config=config_file,
        select=select,
        force=force,
        allow_reset=allow_reset,
        session_socket=socket,
        drain=drain_wait is not None,
        drain_wait=int(drain_wait or 0),
        **request_backend(gpu),
    )


@mig.command("plan")
@config_option
@select_option
@force_option
@drain_option
@session_socket_option
@gpu_backend_options
@json_option
def mig_plan(
    config_file: str,
    select: str | None,
    force: bool,
    drain_wait: float | None,
    session_socket: str | None,
    gpu: GpuSelection,
    as_json: bool,
) -> None:
    """Show what applying a layout would change (changes nothing), with the sessions and processes it ends first.

    Where the real run would be refused (busy instances without --force, the session daemon not
    answering, outside the change window), shows the layout asked for and exits 4 with the refusal,
    as `apply` would.
    """
    request = _mig_request(config_file, select, force, False, gpu, session_socket, drain_wait)
    emit_outcome(_refused(MigLayoutOp().run(request, check_mode=True)), as_json, _render_layouts)


def _refused(o: Outcome[MigResult]) -> Outcome[MigResult]:
    """A plan the real run would refuse exits as that run would (4), with the refusal as its failure (in
    ``--json`` too), instead of "no change needed" and 0."""
    if o.result.refusal is None:
        return o
    why = f"the real run will be refused: {o.result.refusal}"
    failure = Failure(message=why, exit_code=RefusedError.exit_code)
    return o.model_copy(update={"failure": failure, "warnings": [w for w in o.warnings if w != why]})


@mig.command("apply")
@config_option
@select_option
@force_option
@click.option(
    "--allow-reset", is_flag=True, help="Reset GPUs whose MIG mode must change (only when nothing holds them)."
)
@drain_option
@session_socket_option
@gpu_backend_options
@json_option
def mig_apply(
    config_file: str,
    select: str | None,
    force: bool,
    allow_reset: bool,
    drain_wait: float | None,
    session_socket: str | None,
    gpu: GpuSelection,
    as_json: bool,
) -> None:
    """Apply a layout with the fewest changes; a satisfied layout changes nothing.

    A reset left pending (no --allow-reset) or a reboot the platform needs is not an error: exit 0
    with a warning and `pending` in the result. A reset that --allow-reset allowed but something
    holding the GPU prevented exits 1. Instances with processes or live sessions are busy: refused (exit 4)
    without --force; with it, their sessions are ended first (reason layout) and their processes stopped.
    """
    request = _mig_request(config_file, select, force, allow_reset, gpu, session_socket, drain_wait)
    emit_outcome(MigLayoutOp(progress=progress).run(request), as_json, _render_layouts)


def _render_suggestion(s: MigSuggestion) -> str:
    head = f"{s.host}: MIG demand from {s.since:%Y-%m-%d %H:%M}Z to {s.until:%Y-%m-%d %H:%M}Z ({s.registry}); " + (
        f"the suggestion avoids {s.refusals_avoided} of the refusals replayed" if s.changed else "no change"
    )
    rows = [
        [
            p.profile,
            f"{p.slices_now} -> {p.slices_suggested}",
            p.refused_asks,
            p.peak_in_use,
            f"{p.slice_hours_used:g}",
            f"{p.slice_hours_idle:g}",
            f"{p.replayed_refusals_now} -> {p.replayed_refusals_suggested}",
        ]
        for p in s.profiles
    ]
    headers = ["profile", "slices", "refused", "peak", "slice-h used", "slice-h idle", "replayed refusals"]
    lines = [head, "", table(headers, rows), ""]
    lines += [f"- {r}" for r in s.reasons]
    lines += ["", "assuming: " + "; ".join(s.assumptions), "", _layout_yaml(s)]
    return "\n".join(lines).rstrip()


def _layout_yaml(s: MigSuggestion) -> str:
    import yaml

    return yaml.safe_dump(s.layout, sort_keys=False, default_flow_style=None).rstrip()


@mig.command("suggest")
@click.option("--since", default="14d", show_default=True, help="How far back the history reaches, e.g. 36h or 30d.")
@click.option(
    "--registry",
    "registry_file",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The session registry to read (default: the `db` of /etc/calque/session.yaml).",
)
@click.option(
    "--output",
    "-o",
    "output",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the suggested layout (mig-parted version: v1 YAML) here, for `calque gpu mig plan --config`.",
)
@gpu_backend_options
@json_option
def mig_suggest(since: str, registry_file: Path | None, output: Path | None, gpu: GpuSelection, as_json: bool) -> None:
    """Suggest a MIG layout for this host from its session registry: refused checkouts and slice-hours by profile.

    Reads the registry read-only (the daemon need not run) and the GPUs' current layout, replays the
    history against candidate layouts of each card and prints the layout that refuses fewest asks,
    with its expected effect per profile and why. A history without refusals suggests no change.
    Changes nothing on the host: plan and apply the written layout with `calque gpu mig plan|apply`.
    """
    from calque.durations import parse_duration
    from calque.gpu.suggest import suggest
    from calque.session.client.history import read_history
    from calque.session.session_config import load_config

    try:
        window = parse_duration(since, what="--since")
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if window <= 0:
        raise UsageError("--since must be positive, e.g. 14d")
    path = registry_file if registry_file is not None else load_config(None).db
    until = time.time()
    history = read_history(path, until - window, until)
    result = suggest(current_layout(open_backend(gpu)), history, socket.gethostname())
    if output is not None:
        try:
            output.write_text(_layout_yaml(result) + "\n", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write the suggested layout to {output}: {exc.strerror or exc}") from exc
    emit(result, as_json, _render_suggestion)
