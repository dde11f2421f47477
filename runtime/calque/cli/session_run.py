"""``calque session run`` / ``shell``: start work inside the session's cgroup, so it ends with the session.

The daemon adopts this very process (its pid, from SO_PEERCRED) into the session's cgroup; then
this process execs the command with the session's environment, keeping its pid and so its cgroup.
Every child follows. ``eval "$(calque session checkout --shell)"`` remains, the weaker mode: the
shell is not in the cgroup, so only what holds the slice's nodes open (or runs on the slice) is
ended with the session.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import click

from calque.errors import UsageError

session_option = click.option(
    "--session", "session_id", default=None, help="The session to run in (default: your only session)."
)


def _enter(socket_path: Path, session_id: str | None) -> dict[str, str]:
    from calque.session.client.connection import SessionClient

    return {**os.environ, **SessionClient(socket_path).adopt(session_id).env}


def _exec(argv: list[str], env: dict[str, str]) -> None:
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        raise UsageError(f"cannot run {argv[0]!r}: {exc.strerror or exc}; check the command name and PATH") from exc


def add_to(session: click.Group, socket_option: click.decorators.FC) -> None:
    """Register ``run`` and ``shell`` on the ``session`` group (with its ``--socket`` option)."""

    @session.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
    @session_option
    @socket_option  # type: ignore[untyped-decorator]
    @click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
    def run(session_id: str | None, socket_path: Path, command: tuple[str, ...]) -> None:
        """Run COMMAND inside your session: it and its children end when the session does.

        Example: calque session run -- python train.py
        """
        _exec(list(command), _enter(socket_path, session_id))

    @session.command()
    @session_option
    @socket_option  # type: ignore[untyped-decorator]
    def shell(session_id: str | None, socket_path: Path) -> None:
        """Start your login shell inside your session (ends, with everything started from it, with the session)."""
        sh = os.environ.get("SHELL") or pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
        _exec([sh], _enter(socket_path, session_id))
