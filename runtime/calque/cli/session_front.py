"""The institution's commands on ``calque session``: ``checkout --anywhere`` (through the broker),
``queue``, ``list --all``/``status --all`` (the broker's view of every host), and ``broker`` (the
front-door service itself, as ``serve`` is a host's)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from calque.cli.options import path_option
from calque.cli.output import emit, table, warn
from calque.errors import CalqueError, UsageError
from calque.timefmt import CLOCK, utc_text

if TYPE_CHECKING:
    from calque.models.broker import Grant, HostView, QueueEntry
    from calque.models.session import Session
    from calque.session.client.broker import BrokerClient

broker_socket_option = path_option(
    "--broker-socket",
    "broker_socket",
    envvar="CALQUE_BROKER_SOCKET",
    default="/run/calque/broker.sock",
    help="The broker's unix socket (on the front-door host; elsewhere institution.yaml's broker, over TCP).",
)


def _broker(path: Path) -> BrokerClient:
    from calque.session.client.broker import BrokerClient

    return BrokerClient.here(path)


def checkout_anywhere(
    broker_socket: Path,
    *,
    profile: str | None,
    mps: bool,
    gpu: int | None,
    ttl: str | None,
    consent: bool,
    wait: bool,
    wait_timeout: float | None,
    lab: str | None,
    as_shell: bool,
    as_json: bool,
    reservation: str | None = None,
) -> None:
    """``checkout --anywhere``: a slice on any host, through the broker; the answer names the host."""
    from calque.models.broker import AnywhereArgs
    from calque.session.client.connection import typed
    from calque.session.client.shellenv import shell_exports
    from calque.session.client.verbs import stderr

    args = typed(
        AnywhereArgs,
        profile=profile,
        mps=mps,
        gpu=gpu,
        ttl=ttl,
        consent=consent,
        wait=wait,
        wait_timeout=wait_timeout,
        lab=lab,
        reservation=reservation,
    )
    if wait:
        stderr("joining the institution's queue (`calque session queue` shows your place)")
    g = _broker(broker_socket).anywhere(args, progress=stderr)
    for w in [*g.session.warnings, *([g.note] if g.note else [])]:
        warn(w)
    if as_shell:
        env = {**g.session.env, "CALQUE_SESSION_HOST": g.host, "CALQUE_SESSION_REF": g.ref}
        click.echo(shell_exports(env, warn))
        return
    emit(g, as_json, _render_grant)
    if not as_json:
        click.echo(
            f"(work there: ssh -t {g.host} calque session shell --session {g.session.id}; "
            f"check in from anywhere: calque session checkin {g.ref})",
            err=True,
        )


def checkout_here(socket_path: Path, broker_socket: Path, *, direct: bool, **co: Any) -> Session:
    """A plain ``checkout``: through the institution's queue while this host's daemon says its broker
    answers (``door``), for this host's slices only (``--gpu``: that GPU's), ``--wait`` being a place
    in that queue; from the daemon itself on a host of no institution, in degraded mode (said on
    stderr), or with ``--direct``."""
    from calque.models.broker import AnywhereArgs
    from calque.session.client import verbs as core
    from calque.session.client.broker import MUNGE_SOCKET_ENV, BrokerAddress, BrokerClient
    from calque.session.client.connection import SessionClient, typed

    client = SessionClient(socket_path)
    reservation = co.pop("reservation", None)
    try:
        door = None if direct else client.door()
    except CalqueError:
        # No daemon to ask (or one that fails the question): the direct checkout below says what is
        # wrong in its own order, a refused consent before an unreachable daemon.
        door = None
    if door is None or door.mode != "queue" or door.broker is None:
        if door is not None and door.mode == "degraded":
            warn(door.describe())
        if reservation is not None:
            raise UsageError("--reservation is the institution's broker's: add --anywhere (or wait until it answers)")
        return core.checkout(client, direct=direct, progress=core.stderr, **co)
    # --gpu N: that GPU's slices on this host, in the queue's order like any other (the broker checks
    # the index against what the host lists before it queues anything).
    args = typed(AnywhereArgs, host=door.host, reservation=reservation, **co)
    if broker_socket.is_socket():  # on the front-door host itself
        broker = BrokerClient(broker_socket)
    else:
        b = door.broker
        munge = os.environ.get(MUNGE_SOCKET_ENV)
        place = BrokerAddress(b.name, b.address, b.port, b.service_user, Path(munge) if munge else None)
        broker = BrokerClient(broker_socket, remote=place)
    if args.wait:
        on = door.host + (f" GPU {args.gpu}" if args.gpu is not None else "")
        core.stderr(f"joining the institution's queue for a slice on {on} (`calque session queue`)")
    g = broker.anywhere(args, progress=core.stderr)
    if g.note:
        warn(g.note)
    return g.session


def door_notice(socket_path: Path) -> None:
    """On stderr, when this host serves checkouts outside the queue because its broker is silent."""
    from calque.session.wire import SessionSocket

    try:
        state = SessionSocket(socket_path).call("door")
    except CalqueError:
        return  # an older daemon (no door), or none: the command itself says what is wrong
    if isinstance(state, dict) and state.get("mode") == "degraded":
        from calque.models.session_answers import DoorState

        warn(DoorState.model_validate(state).describe())


def _render_grant(g: Grant) -> str:
    s = g.session
    until = utc_text(s.expires_at, CLOCK)
    lines = [f"session {g.ref}: {s.slice_id} ({s.profile}, gpu {s.gpu_index}) on {g.host} until {until}"]
    lines += [f"  {k}={v}" for k, v in sorted(s.env.items())]
    return "\n".join(lines)


def _render_queue(entries: list[QueueEntry]) -> str:
    if not entries:
        return "no request of yours is queued"
    rows = [
        [
            e.id,
            e.user,
            e.lab,
            (e.profile or e.kind) + (f" gpu {e.gpu}" if e.gpu is not None else ""),
            e.state,
            e.position if e.position is not None else "",
            utc_text(e.estimate, CLOCK) if e.estimate else ("" if e.state != "queued" else "unknown"),
            f"{e.session_id}@{e.host}" if e.session_id else (e.host or ""),
        ]
        for e in entries
    ]
    out = table(["REQUEST", "USER", "LAB", "WANTS", "STATE", "POS", "ESTIMATE", "GRANT"], rows)
    # Requests that ended with nobody told (dropped, expired): why, under the table.
    return "\n".join([out, *(f"{e.id} {e.state}: {e.note}" for e in entries if e.note)])


def render_hosts(views: list[HostView]) -> str:
    rows: list[list[Any]] = []
    for v in views:
        if not v.reachable:
            rows.append([v.name, "", "", "", "unreachable", "", "", ""])
            continue
        for st in v.slices:
            state = "busy" if st.busy else "drained" if st.drained else "unavailable" if st.unavailable else "free"
            ref = f"{st.session_id}@{v.name}" if st.session_id else ""
            rows.append(
                [
                    v.name,
                    st.slice.id,
                    st.slice.profile,
                    st.slice.gpu_index,
                    state,
                    utc_text(st.busy_until, CLOCK),
                    st.holder or "",
                    ref,
                ]
            )
    if not rows:
        return "the institution has no hosts"
    out = table(["HOST", "SLICE", "PROFILE", "GPU", "STATE", "UNTIL", "HOLDER", "SESSION"], rows)
    drains = dict.fromkeys(f"{v.name}: {st.drained.describe()}" for v in views for st in v.slices if st.drained)
    return "\n".join([out, *(f"drained: {d}" for d in drains)])


def render_mine(views: list[HostView], uid: int) -> str:
    rows = [
        [f"{st.session_id}@{v.name}", v.name, st.slice.id, st.slice.profile, utc_text(st.busy_until, CLOCK)]
        for v in views
        for st in v.slices
        if st.holder_uid == uid and st.session_id
    ]
    if not rows:
        return "you hold no session on any host"
    return table(["SESSION", "HOST", "SLICE", "PROFILE", "UNTIL"], rows)


def all_hosts(broker_socket: Path, as_json: bool, mine: bool) -> None:
    """``list --all`` / ``status --all``: every host as the broker last saw it."""
    import os

    views = _broker(broker_socket).hosts()
    if as_json:
        if mine:
            emit([st for v in views for st in v.slices if st.holder_uid == os.getuid()], True, str)
        else:
            emit(views, True, str)
        return
    click.echo(render_mine(views, os.getuid()) if mine else render_hosts(views))
    if not mine:  # the slices reservations under way hold, use and handed back
        from calque.cli.session_reserve import under_way
        from calque.models.reservation import ReservationView

        try:
            views_ = [ReservationView.model_validate(v) for v in _broker(broker_socket).call("reservations", {})]
        except CalqueError:  # a broker older than reservations: the hosts alone
            views_ = []
        for line in under_way(views_):
            click.echo(f"reservation {line}")
    down = [v.name for v in views if not v.reachable]
    if down:
        warn(f"not answering the broker now: {', '.join(down)} (their sessions go on; ask there)")


def on_host(broker_socket: Path, ref: str, op: str, by: str | None = None) -> Session:
    """``checkin``/``extend``/``env`` of ``SESSION@HOST``: the broker makes the call on that host as you."""
    from calque.errors import UsageError
    from calque.models.session import Session

    client = _broker(broker_socket)
    if op != "env":
        s = Session.model_validate(client.on_host(ref, op, by))
        for w in s.warnings if op == "extend" else []:  # extended less than asked: a reservation ahead
            warn(w)
        return s
    sid = ref.split("@", 1)[0]
    for s in client.on_host(ref, "status"):
        if s.get("id") == sid:
            return Session.model_validate(s)
    raise UsageError(f"you hold no live session {ref}; `calque session status --all` lists yours")


def add_to(session: click.Group) -> None:
    """Register ``queue``, ``broker``, ``reserve`` and ``reservations`` on the ``session`` group."""

    @session.command()
    @click.option("--all", "all_users", is_flag=True, help="Every user's requests (root and the admin group).")
    @click.option("--cancel", "cancel_id", default=None, help="Cancel your queued request ID.")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @broker_socket_option
    def queue(all_users: bool, cancel_id: str | None, as_json: bool, broker_socket: Path) -> None:
        """The institution's waiting queue: your requests with their place and an estimate (admins: all)."""
        client = _broker(broker_socket)
        if cancel_id is not None:
            done = client.cancel(cancel_id)
            emit(done, as_json, lambda d: f"request {d['id']} {d['state']}")
            return
        emit(client.queue(all_users), as_json, _render_queue)

    @session.command()
    @path_option(
        "--config",
        "config_path",
        envvar="CALQUE_BROKER_CONFIG",
        default=None,
        help="YAML config (default /etc/calque/broker.yaml when present).",
    )
    @click.option("--socket", "socket_path", type=click.Path(path_type=Path), default=None, help="Its unix socket.")
    @click.option("--db", type=click.Path(path_type=Path), default=None, help="The queue's SQLite file.")
    def broker(config_path: Path | None, **paths: Any) -> None:
        """Run the institution's broker (on the front-door host, under systemd: calque-broker.service)."""
        import os
        import sys

        from calque.session.broker.broker_config import load_broker_config

        cfg = load_broker_config(config_path)
        updates = {k: v for k, v in paths.items() if v is not None}
        if "socket_path" in updates:
            updates["socket"] = updates.pop("socket_path")
        cfg = cfg.model_validate({**cfg.model_dump(), **updates})
        # A program of its own, as the host daemon is: this process becomes it (same pid, for systemd).
        env = {**os.environ, "CALQUE_BROKER_CONFIG_JSON": cfg.model_dump_json()}
        os.execve(sys.executable, [sys.executable, "-m", "calque.session.broker"], env)

    from calque.cli.session_reserve import add_to as add_reserve

    add_reserve(session, broker_socket_option)
    # ``checkout --reservation``, added here: session.py is at its length limit.
    help_ = "A class reservation under way whose group you are in (one of yours applies by itself)."
    session.commands["checkout"].params.append(click.Option(["--reservation"], default=None, help=help_))
