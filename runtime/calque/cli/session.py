"""``calque session ...``: check a MIG slice or MPS slot out and in, as yourself."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from calque.cli.options import DURATION, gpu_backend_flags, json_option, path_option, shared_gpu_consent_option
from calque.cli.output import emit, table, to_json, warn
from calque.cli.session_front import (
    all_hosts,
    broker_socket_option,
    checkout_anywhere,
    checkout_here,
    door_notice,
    on_host,
)
from calque.session.paths import DEFAULT_SOCKET
from calque.timefmt import CLOCK, utc_text

# A researcher's command starts fast: the client, the models and pydantic load when a command runs
# (not for --help), and the daemon's modules only for `serve`. bench/cli_startup.py measures it.
if TYPE_CHECKING:
    from calque.models.session import Session, UsageReport
    from calque.session.client.connection import SessionClient
    from calque.session.client.views import SessionView, SliceStateView

socket_option = path_option(
    "--socket",
    "socket_path",
    envvar="CALQUE_SESSION_SOCKET",
    default=str(DEFAULT_SOCKET),
    help="The session daemon's unix socket.",
)


def _client(socket_path: Path) -> SessionClient:
    from calque.session.client.connection import SessionClient

    return SessionClient(socket_path)


def _human_left(until: datetime, now: datetime) -> str:
    from calque.session.client.views import human_left

    return human_left(until, now)


def _render_session(s: Session) -> str:
    now = datetime.now(timezone.utc)
    where = f"{s.slice_id} ({s.profile}, gpu {s.gpu_index})"
    if s.ended_at is not None:
        return f"session {s.id} on {where} ended ({s.end_reason})"
    lines = [f"session {s.id}: {where} until {utc_text(s.expires_at, CLOCK)} ({_human_left(s.expires_at, now)} left)"]
    if s.idle_ends_at is not None or s.idle_exempt:
        lines.append(f"  idle: {_idle(s, now)}")
    lines += [f"  {k}={v}" for k, v in sorted(s.env.items())]
    return "\n".join(lines)


def _render_sessions(ss: list[SessionView]) -> str:
    if not ss:
        return "you hold no session"
    now = datetime.now(timezone.utc)
    rows = [
        [s.id, s.slice_id, s.profile, s.gpu_index, utc_text(s.expires_at, CLOCK), _human_left(s.expires_at, now)]
        for s in ss
    ]
    if not any(s.idle_ends_at or s.idle_exempt for s in ss):
        out = table(["SESSION", "SLICE", "PROFILE", "GPU", "UNTIL", "LEFT"], rows)
    else:
        out = table(
            ["SESSION", "SLICE", "PROFILE", "GPU", "UNTIL", "LEFT", "IDLE"],
            [[*row, _idle(s, now)] for row, s in zip(rows, ss, strict=True)],
        )
    # Each warning once (the host's spot warning concerns every session), naming the sessions it is about.
    said = []
    for w in dict.fromkeys(w for s in ss for w in s.warnings):
        ids = [s.id for s in ss if w in s.warnings]
        said.append(f"warning: {w}" + (f" [{', '.join(ids)}]" if len(ids) < len(ss) else ""))
    return "\n".join([out, *said])


def _idle(s: Session | SessionView, now: datetime) -> str:
    """The idle clock: how long the slice has been idle, and when it ends if it stays so."""
    if s.active_at is None or s.idle_ends_at is None:
        return "exempt"
    from calque.durations import format_duration

    idle = max(0.0, (now - s.active_at).total_seconds())
    limit = (s.idle_ends_at - s.active_at).total_seconds()
    if idle < min(10.0, limit / 10) + 2:  # the daemon writes an active slice's clock that often (idle.py)
        return "active"
    return f"{format_duration(idle)}, ends {utc_text(s.idle_ends_at, CLOCK)} unless active"


def _state(st: SliceStateView) -> str:
    """A held slice is busy wherever it is; a free one on a drained GPU is offered to nobody."""
    if st.busy:
        return "busy"
    if st.drained:
        return "drained"
    return "unavailable" if st.unavailable else "not yours" if st.why_not else "free"


def _render_slices(states: list[SliceStateView]) -> str:
    if not states:
        return "this host has no slices (no MIG devices and no MPS slots configured)"
    # A free slot the daemon would refuse this caller reads "not yours", one whose MPS daemon is down
    # "unavailable" (a held one stays "busy"), with why in its own column.
    why = any(st.why_not for st in states)
    rows = [
        [
            st.slice.id,
            st.slice.kind,
            st.slice.profile,
            st.slice.gpu_index,
            _state(st),
            utc_text(st.busy_until, CLOCK),
            st.holder or "",
            st.session_id or "",
            *([st.why_not or ""] if why else []),
        ]
        for st in states
    ]
    head = ["SLICE", "KIND", "PROFILE", "GPU", "STATE", "UNTIL", "HOLDER", "SESSION", *(["WHY NOT"] if why else [])]
    # Each drain once, under the table: who took what out and why (a held slice there stays busy).
    drains = dict.fromkeys(st.drained.describe() for st in states if st.drained)
    return "\n".join([table(head, rows), *(f"drained: {d}" for d in drains)])


def _render_report(r: UsageReport) -> str:
    head = f"usage from {r.since:%Y-%m-%d %H:%M}Z to {r.until:%Y-%m-%d %H:%M}Z"
    if not r.rows:
        return head + "\nno sessions"
    return (
        head
        + "\n"
        + table(
            ["USER", "PROFILE", "KIND", "SESSIONS", "GPU-HOURS"],
            [[u.user, u.profile, u.kind, u.sessions, f"{u.gpu_hours:.2f}"] for u in r.rows],
        )
    )


@click.group()
def session() -> None:
    """Check a GPU slice out for a bounded time, use it, and check it in.

    Talks to the session daemon (`calque session serve`) on this host, which knows you by your Unix
    user; nobody can check out, extend or end a session in someone else's name.
    """


@session.command()
@click.option("--profile", default=None, help="MIG profile to check out, e.g. 1g.24gb (any MIG slice if omitted).")
@click.option("--mps", is_flag=True, help="Check out an MPS client slot instead of a MIG slice.")
@click.option("--gpu", type=int, default=None, help="Only slices on this GPU index of this host (queued for it there).")
@click.option("--ttl", default=None, help="How long to hold it, e.g. 30m or 2h (default: the host's default).")
@click.option("--wait", is_flag=True, help="Wait for a slice to free up (with --anywhere: join the queue).")
@click.option("--anywhere", is_flag=True, help="Any host of the institution with a free slice, through the broker.")
@click.option("--wait-timeout", type=DURATION, default=None, help="Give up waiting after this long, e.g. 10m.")
@click.option("--lab", default=None, help="The lab to bill, of those your groups are in (default: the first).")
@click.option("--direct", is_flag=True, help="Admins: past the institution's queue on this host (audited).")
@click.option(
    "--shell", "as_shell", is_flag=True, help='Print `export` lines: eval "$(calque session checkout --shell)".'
)
@json_option
@shared_gpu_consent_option
@socket_option
@broker_socket_option
def checkout(
    anywhere: bool,
    lab: str | None,
    direct: bool,
    as_shell: bool,
    as_json: bool,
    shared_gpu_consent: bool,
    socket_path: Path,
    broker_socket: Path,
    **co: Any,
) -> None:
    """Check a slice out (through the broker's queue on an institution's host); exit 5 if none is free."""
    from calque.session.client.shellenv import shell_exports

    if as_shell and as_json:
        raise click.UsageError("give --json or --shell, not both")
    co.update(consent=shared_gpu_consent, lab=lab)
    if anywhere:
        checkout_anywhere(broker_socket, as_shell=as_shell, as_json=as_json, **co)
        return
    s = checkout_here(socket_path, broker_socket, direct=direct, **co)
    for w in s.warnings:
        warn(w)
    if as_shell:
        click.echo(shell_exports(s.env, warn))
        return
    emit(s, as_json, _render_session)
    if not as_json:
        click.echo(
            f'(use: eval "$(calque session checkout --shell ...)" to export these; check in with '
            f"`calque session checkin {s.id}`)",
            err=True,
        )


@session.command()
@click.argument("session_id", required=False)
@json_option
@socket_option
@broker_socket_option
def checkin(session_id: str | None, as_json: bool, socket_path: Path, broker_socket: Path) -> None:
    """Give your slice back (your only session when SESSION_ID is omitted; SESSION@HOST: on that host)."""
    from calque.session.client import verbs as core

    if session_id and "@" in session_id:
        emit(on_host(broker_socket, session_id, "checkin"), as_json, _render_session)
        return
    emit(core.checkin(_client(socket_path), session_id), as_json, _render_session)


@session.command()
@click.argument("session_id", required=False)
@click.option("--by", required=True, help="How much longer, e.g. 30m (bounded by the host's maximum total TTL).")
@json_option
@socket_option
@broker_socket_option
def extend(session_id: str | None, by: str, as_json: bool, socket_path: Path, broker_socket: Path) -> None:
    """Push your session's deadline out (SESSION@HOST: a session on that host)."""
    from calque.session.client import verbs as core

    if session_id and "@" in session_id:
        emit(on_host(broker_socket, session_id, "extend", by), as_json, _render_session)
        return
    emit(core.extend(_client(socket_path), session_id, by), as_json, _render_session)


def _listing(every_host_help: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The options `status` and `list` share: --all (the broker's view of every host), --json, the sockets."""

    def stack(f: Callable[..., None]) -> Callable[..., None]:
        f = json_option(socket_option(broker_socket_option(f)))  # listed in this order, as written on top
        return click.option("--all", "every_host", is_flag=True, help=every_host_help)(f)

    return stack


def _show_listing(
    op: Literal["status", "list"], every_host: bool, as_json: bool, socket_path: Path, broker: Path
) -> None:
    """`status` (your sessions) and `list` (the slices) alike: every host's through the broker with
    --all; else this host's, as the models' own JSON or as a table read without pydantic (views.py)."""
    if every_host:
        all_hosts(broker, as_json, mine=op == "status")
        return
    door_notice(socket_path)  # degraded mode: said on stderr, so --json stays the answer
    if as_json:
        from calque.session.client import verbs as core

        client = _client(socket_path)
        click.echo(to_json(core.status(client) if op == "status" else core.list_slices(client)))
        return
    from calque.session.client import views
    from calque.session.wire import SessionSocket

    answer = SessionSocket(socket_path).call(op)
    click.echo(
        _render_sessions(views.sessions(answer)) if op == "status" else _render_slices(views.slice_states(answer))
    )


@session.command()
@_listing("Your sessions on every host (the broker's view).")
def status(every_host: bool, as_json: bool, socket_path: Path, broker_socket: Path) -> None:
    """Your sessions, with time left."""
    _show_listing("status", every_host, as_json, socket_path, broker_socket)


@session.command("env")
@click.argument("session_id", required=False)
@click.option("--shell", "as_shell", is_flag=True, help='Print `export` lines: eval "$(calque session env --shell)".')
@json_option
@socket_option
@broker_socket_option
def env_cmd(session_id: str | None, as_shell: bool, as_json: bool, socket_path: Path, broker_socket: Path) -> None:
    """Your session's variables as the daemon has them now (CALQUE_SESSION_EXPIRES moves with `extend`)."""
    from calque.session.client import verbs as core
    from calque.session.client.shellenv import shell_exports

    if as_shell and as_json:
        raise click.UsageError("give --json or --shell, not both")
    if session_id and "@" in session_id:
        s = on_host(broker_socket, session_id, "env")
    else:
        s = core.one_session(_client(socket_path), session_id)
    if as_shell:
        click.echo(shell_exports(s.env, warn))
        return
    emit(s, as_json, lambda x: "\n".join(f"{k}={v}" for k, v in sorted(x.env.items())))


@session.command("list")
@_listing("Every host's slices (the broker's view).")
def list_cmd(every_host: bool, as_json: bool, socket_path: Path, broker_socket: Path) -> None:
    """Every slice on this host: free, or busy until when (admins also see holders)."""
    _show_listing("list", every_host, as_json, socket_path, broker_socket)


@session.command()
@click.argument("session_id")
@click.option("--force", is_flag=True, help="Required: this ends another user's session now.")
@click.option("--reason", default=None, help="Why, for the audit trail.")
@json_option
@socket_option
def release(session_id: str, force: bool, reason: str | None, as_json: bool, socket_path: Path) -> None:
    """End someone's session now (root or the admin group only)."""
    from calque.session.client import verbs as core

    emit(core.release(_client(socket_path), session_id, force, reason), as_json, _render_session)


@session.command()
@socket_option
def metrics(socket_path: Path) -> None:
    """The daemon's Prometheus metrics (live sessions per user for root and the admin group only)."""
    click.echo(_client(socket_path).metrics(), nl=False)


@session.command()
@click.option("--since", default="7d", show_default=True, help="How far back, e.g. 24h or 30d.")
@json_option
@socket_option
def report(since: str, as_json: bool, socket_path: Path) -> None:
    """GPU-hours per user and profile, from the registry's usage table (yours only unless you are an admin)."""
    from calque.session.client import verbs as core

    emit(core.report(_client(socket_path), since), as_json, _render_report)


@session.command()
@path_option(
    "--config",
    "config_path",
    envvar="CALQUE_SESSION_CONFIG",
    default=None,
    help="YAML config (default /etc/calque/session.yaml when present).",
)
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), envvar="CALQUE_SESSION_SOCKET", default=None)
@click.option(
    "--db", type=click.Path(path_type=Path), envvar="CALQUE_SESSION_DB", default=None, help="SQLite registry."
)
@click.option("--audit-log", type=click.Path(path_type=Path), envvar="CALQUE_SESSION_AUDIT", default=None)
@gpu_backend_flags
@click.option(
    "--host-root",
    type=click.Path(path_type=Path),
    envvar="CALQUE_HOST_ROOT",
    default=None,
    help="Where /proc/driver/nvidia and /dev/nvidia-caps live (the simulator's root in tests).",
)
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus metrics on PORT (default: off).")
@click.option("--metrics-addr", default=None, help="The address the metrics port binds (default 127.0.0.1).")
def serve(config_path: Path | None, metrics_port: int | None, metrics_addr: str | None, **paths: Any) -> None:
    """Run the session daemon (as root, under systemd: calque-session.service)."""
    import os
    import sys

    from calque.session.session_config import load_config

    cfg = load_config(config_path)
    updates = {k: v for k, v in paths.items() if v is not None}
    if "socket_path" in updates:
        updates["socket"] = updates.pop("socket_path")
    if metrics_port is not None:
        updates["metrics_port"] = metrics_port
    if metrics_addr is not None:
        updates["metrics_addr"] = metrics_addr
    cfg = cfg.model_validate({**cfg.model_dump(), **updates})
    # The daemon is a program of its own: this process becomes it (same pid, for systemd) and never
    # imports it, so a researcher's command and the privileged service share only the contracts.
    env = {**os.environ, "CALQUE_SESSION_DAEMON_CONFIG": cfg.model_dump_json()}
    os.execve(sys.executable, [sys.executable, "-m", "calque.session.daemon"], env)


def _add_run_and_shell() -> None:
    from calque.cli import session_drain, session_front, session_jupyter, session_run
    from calque.cli.session_fleet import fleet

    session_run.add_to(session, socket_option, broker_socket_option)
    session_jupyter.add_to(session, socket_option, broker_socket_option)
    session_front.add_to(session)
    session.add_command(fleet)
    session_drain.add_to(session, socket_option)


_add_run_and_shell()
