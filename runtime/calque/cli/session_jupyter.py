"""``calque session jupyter``: JupyterLab inside a session, reached through one ssh tunnel.

This process is adopted into the session's cgroup (as ``calque session run`` is), then execs
JupyterLab bound to 127.0.0.1 on a free port: the server, its kernels and terminals run as the user,
see the slice alone (the session's environment) and end with the session (check-in, expiry and idle
reclaim kill the cgroup). The token goes in ``JUPYTER_TOKEN``, never on the command line, because
``/proc/PID/cmdline`` is readable by every user of the host; 127.0.0.1 is reachable by them too, so
the token is what keeps them out. A session on another host (``ID@HOST``, ``--anywhere``) is entered
over ssh, as ``run`` does, and the command there prints the tunnel.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shlex
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import click

from calque.cli.session_run import _exec, _ssh, _target, anywhere_options, session_option
from calque.errors import UsageError

INSTALL_HINT = (
    "install the package `jupyterlab` where the session runs (pip install jupyterlab, "
    "or calque's extra: pip install 'calque[notebooks]'), or put its `jupyter-lab` on PATH"
)


def jupyter_lab_command(path: str | None, python_has_it: bool) -> list[str]:
    """How to start JupyterLab: the user's own ``jupyter-lab`` on ``path`` first (her environment, her
    kernels), else this interpreter's ``jupyterlab`` package; a UsageError naming the package if neither."""
    exe = shutil.which("jupyter-lab", path=path)
    if exe is not None:
        return [exe]
    if python_has_it:
        return [sys.executable, "-m", "jupyterlab"]
    raise UsageError(f"JupyterLab is not installed here: no `jupyter-lab` on PATH; {INSTALL_HINT}")


def free_port() -> int:
    """A port nothing listens on now on 127.0.0.1 (JupyterLab is told not to try others: the printed
    tunnel must name the port it binds)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_argv(lab: list[str], port: int, extra: tuple[str, ...]) -> list[str]:
    # Command-line settings win over the user's jupyter config: the address and port stay as printed.
    pinned = ["--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0"]
    return [*lab, *extra, *pinned, "--no-browser"]


def tunnel_text(host: str, port: int, token: str, session: str, until: str) -> str:
    return (
        f"JupyterLab in session {session} on {host}, until {until} (it stops when the session ends).\n"
        f"On your own machine, run:\n"
        f"  ssh -N -L {port}:127.0.0.1:{port} {shlex.quote(host)}\n"
        f"then open:\n"
        f"  http://127.0.0.1:{port}/lab?token={token}\n"
    )


def add_to(session: click.Group, socket_option: click.decorators.FC, broker_option: click.decorators.FC) -> None:
    """Register ``jupyter`` on the ``session`` group."""

    @session.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
    @session_option
    @anywhere_options
    @click.option("--port", type=click.IntRange(1, 65535), default=None, help="Bind this port (default: a free one).")
    @click.option("--tunnel-host", default=None, hidden=True, help="The host name the ssh command names.")
    @socket_option  # type: ignore[untyped-decorator]
    @broker_option  # type: ignore[untyped-decorator]
    @click.argument("lab_args", nargs=-1, type=click.UNPROCESSED)
    def jupyter(
        session_id: str | None,
        port: int | None,
        tunnel_host: str | None,
        socket_path: Path,
        broker_socket: Path,
        lab_args: tuple[str, ...],
        **co: Any,
    ) -> None:
        """Start JupyterLab inside your session, bound to 127.0.0.1, and print the ssh tunnel and URL.

        The server, its kernels and terminals run on the session's slice and end with the session.
        Arguments after -- go to jupyter-lab. Example: calque session jupyter --anywhere --profile 1g.24gb
        """
        target = _target(session_id, broker_socket, co)
        if target is not None:
            remote = ["calque", "session", "jupyter", "--session", target[1], "--tunnel-host", target[0]]
            if port is not None:
                remote += ["--port", str(port)]
            _ssh(target[0], [*remote, "--", *lab_args] if lab_args else remote)
        lab = jupyter_lab_command(os.environ.get("PATH"), importlib.util.find_spec("jupyterlab") is not None)
        adopted = _enter_adopted(socket_path, session_id)
        env = adopted["env"]
        chosen = port if port is not None else free_port()
        token = secrets.token_hex(24)
        env["JUPYTER_TOKEN"] = token
        s = adopted["session"]
        host = tunnel_host or socket.gethostname()
        click.echo(tunnel_text(host, chosen, token, s.id, f"{s.expires_at:%Y-%m-%d %H:%M:%SZ}"), err=True, nl=False)
        sys.stderr.flush()  # the exec keeps nothing buffered
        _exec(server_argv(lab, chosen, lab_args), env)


def _enter_adopted(socket_path: Path, session_id: str | None) -> dict[str, Any]:
    """This process in the session's cgroup: the environment to run with and the session."""
    from calque.session.client.connection import SessionClient

    a = SessionClient(socket_path).adopt(session_id)
    return {"env": {**os.environ, **a.env}, "session": a.session}
