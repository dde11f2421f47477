"""``calque session run`` / ``shell``: start work inside the session's cgroup, so it ends with the session.

The daemon adopts this very process (its pid, from SO_PEERCRED) into the session's cgroup; then
this process execs the command with the session's environment, keeping its pid and so its cgroup.
Every child follows. ``eval "$(calque session checkout --shell)"`` remains, the weaker mode: the
shell is not in the cgroup, so only what holds the slice's nodes open (or runs on the slice) is
ended with the session.

A session on another host (``--session ID@HOST``, or ``--anywhere``: a slice checked out through the
broker first) is entered on its host: ``ssh -t HOST calque session shell --session ID`` with the
institution's own ssh (``CALQUE_SSH`` names another command); adoption needs a process there, so the
daemon there adopts the ssh session's own ``calque``. calque makes no keys: ``docs/session.md``.
"""

from __future__ import annotations

import os
import pwd
import shlex
from pathlib import Path
from typing import Any

import click

from calque.cli.options import DURATION
from calque.errors import UsageError

SSH_ENV = "CALQUE_SSH"

session_option = click.option(
    "--session",
    "session_id",
    default=None,
    help="The session to run in (default: your only session); ID@HOST for one on another host (over ssh).",
)


def anywhere_options(f: Any) -> Any:
    """``--anywhere`` and the checkout options it takes (a slice on any host, through the broker)."""
    for opt in reversed(
        [
            click.option("--anywhere", is_flag=True, help="Check a slice out on any host first, then go there."),
            click.option("--profile", default=None, help="With --anywhere: the MIG profile."),
            click.option("--mps", is_flag=True, help="With --anywhere: an MPS client slot."),
            click.option("--ttl", default=None, help="With --anywhere: how long to hold it, e.g. 2h."),
            click.option("--wait", is_flag=True, help="With --anywhere: join the queue when nothing is free."),
            click.option("--wait-timeout", type=DURATION, default=None, help="With --wait: give up after this long."),
            click.option(
                "--lab",
                default=None,
                help="With --anywhere: the lab to bill, of those your groups are in (default: the first).",
            ),
        ]
    ):
        f = opt(f)
    return f


def _enter(socket_path: Path, session_id: str | None) -> dict[str, str]:
    from calque.session.client.connection import SessionClient

    return {**os.environ, **SessionClient(socket_path).adopt(session_id).env}


def _exec(argv: list[str], env: dict[str, str]) -> None:
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        raise UsageError(f"cannot run {argv[0]!r}: {exc.strerror or exc}; check the command name and PATH") from exc


def _granted(broker_socket: Path, co: dict[str, Any]) -> str:
    """``--anywhere``: check a slice out through the broker; its ``SESSION@HOST``."""
    from calque.models.broker import AnywhereArgs
    from calque.session.client.broker import BrokerClient
    from calque.session.client.connection import typed
    from calque.session.client.verbs import stderr

    args = typed(AnywhereArgs, **co)
    if args.wait:
        stderr("joining the institution's queue (`calque session queue` shows your place)")
    g = BrokerClient.here(broker_socket).anywhere(args, progress=stderr)
    stderr(f"session {g.ref}: {g.session.slice_id} ({g.session.profile}) until {g.session.expires_at:%H:%M:%SZ}")
    return g.ref


def _target(session_id: str | None, broker_socket: Path, co: dict[str, Any]) -> tuple[str, str] | None:
    """(host, session id) when the work goes to another host over ssh; None for this host's session."""
    anywhere = co.pop("anywhere")
    if not anywhere:
        if any(v for v in co.values()):
            raise UsageError("--profile, --mps, --ttl, --wait, --wait-timeout and --lab go with --anywhere")
        if session_id is None or "@" not in session_id:
            return None
        sid, host = session_id.split("@", 1)
        return host, sid
    if session_id is not None:
        raise UsageError("give --session ID@HOST or --anywhere, not both")
    sid, host = _granted(broker_socket, co).split("@", 1)
    return host, sid


def _ssh(host: str, remote: list[str]) -> None:
    """``ssh -t HOST CMD`` (the remote shell parses CMD: quoted here); this process becomes ssh."""
    ssh = shlex.split(os.environ.get(SSH_ENV, "ssh")) or ["ssh"]
    _exec([*ssh, "-t", host, shlex.join(remote)], dict(os.environ))


def add_to(session: click.Group, socket_option: click.decorators.FC, broker_option: click.decorators.FC) -> None:
    """Register ``run`` and ``shell`` on the ``session`` group (with its ``--socket`` option)."""

    @session.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
    @session_option
    @anywhere_options
    @socket_option  # type: ignore[untyped-decorator]
    @broker_option  # type: ignore[untyped-decorator]
    @click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
    def run(
        session_id: str | None, socket_path: Path, broker_socket: Path, command: tuple[str, ...], **co: Any
    ) -> None:
        """Run COMMAND inside your session: it and its children end when the session does.

        Example: calque session run -- python train.py; on any host: calque session run --anywhere -- python train.py
        """
        target = _target(session_id, broker_socket, co)
        if target is not None:
            _ssh(target[0], ["calque", "session", "run", "--session", target[1], "--", *command])
        _exec(list(command), _enter(socket_path, session_id))

    @session.command()
    @session_option
    @anywhere_options
    @socket_option  # type: ignore[untyped-decorator]
    @broker_option  # type: ignore[untyped-decorator]
    def shell(session_id: str | None, socket_path: Path, broker_socket: Path, **co: Any) -> None:
        """Start your login shell inside your session (ends, with everything started from it, with the session)."""
        target = _target(session_id, broker_socket, co)
        if target is not None:
            _ssh(target[0], ["calque", "session", "shell", "--session", target[1]])
        sh = os.environ.get("SHELL") or pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
        _exec([sh], _enter(socket_path, session_id))
