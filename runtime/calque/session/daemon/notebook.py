"""``notebook``: the daemon starts the host's single-user notebook server as the session's user, inside
the session's cgroup, so that it sees the slice alone and ends with the session (issue 36).

A narrow capability. The command is the host's (``notebook_command``), never the request's; the user
is the session's, never the request's (the caller must hold the session: its own user, or the
broker or the institution's hub acting for that user, ``crosshost.py``); the environment is a
fixed base, the admin's ``notebook_env``, the hub's ``JUPYTERHUB_*`` variables (``models/notebook.py``)
and last the session's own, which nothing overrides. Every start is audited with who asked.

The child is ``/bin/sh`` already running as the user (privileges dropped by ``subprocess`` before
exec), blocked reading its stdin until the daemon has moved it into the session's cgroup; only then
does it exec the server, so nothing it runs ever starts outside the session. Its output goes to a log
in the user's home, opened by the child as the user (the daemon, as root, writes nothing there).
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import threading
import urllib.parse
from pathlib import Path

from calque.models.notebook import NotebookArgs, NotebookStarted
from calque.session.daemon import devices
from calque.session.daemon.cgroup import CgroupError
from calque.session.daemon.host import Host
from calque.session.daemon.identity import Caller
from calque.session.daemon.rows import Held
from calque.session.daemon.wire import RequestError

LOG_DIR = ".local/state/calque"  # under the user's home
# $0 is a name; "$@" the server's argv. Waits for the daemon's go (after adoption), then runs as the user.
WAIT_THEN_EXEC = (
    'read go || exit 1; exec </dev/null; cd "$HOME" 2>/dev/null || cd /; '
    f'if mkdir -p "$HOME/{LOG_DIR}" 2>/dev/null; '
    f'then exec >>"$HOME/{LOG_DIR}/notebook-$CALQUE_SESSION_ID.log" 2>&1; else exec >/dev/null 2>&1; fi; '
    'exec "$@"'
)
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


def _free_port(ip: str) -> int:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def _argv(command: list[str], ip: str, port: int) -> list[str]:
    # replace, not format: a brace elsewhere in the admin's command stays as written
    return [a.replace("{ip}", ip).replace("{port}", str(port)) for a in command]


def _where(hub_env: dict[str, str], ip: str, port: int) -> dict[str, str]:
    """The hub's ``JUPYTERHUB_SERVICE_URL`` names where the server listens, which only the daemon knows:
    its scheme and path stay the hub's, the address and port become the daemon's choice."""
    url = hub_env.get("JUPYTERHUB_SERVICE_URL")
    if not url:
        return hub_env
    parts = urllib.parse.urlsplit(url)
    netloc = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
    return {**hub_env, "JUPYTERHUB_SERVICE_URL": urllib.parse.urlunsplit(parts._replace(netloc=netloc))}


def _env(host: Host, held: Held, pw: pwd.struct_passwd, hub_env: dict[str, str]) -> dict[str, str]:
    base = {
        "PATH": BASE_PATH,
        "HOME": pw.pw_dir,
        "USER": pw.pw_name,
        "LOGNAME": pw.pw_name,
        "SHELL": pw.pw_shell or "/bin/sh",
        "LANG": "C.UTF-8",
    }
    return {**base, **hub_env, **host.config.notebook_env, **held.session.env}


def start_notebook(host: Host, c: Caller, held: Held, args: NotebookArgs) -> NotebookStarted:
    s = held.session
    if host.cgroups.mode == "off":
        raise RequestError(
            "refused", "sessions are not cgroups on this host (cgroups: off): a server started here would outlive them"
        )
    try:
        pw = pwd.getpwuid(s.uid)
    except KeyError:
        raise RequestError("refused", f"uid {s.uid} has no name on this host") from None
    try:
        props = devices.scope_properties(host.root, held.slice)
    except (OSError, ValueError) as exc:
        raise RequestError("refused", f"cannot list the devices of {held.slice.id}: {exc}") from exc
    ip = host.config.notebook_ip
    try:
        port = _free_port(ip)
    except OSError as exc:
        raise RequestError("refused", f"cannot bind a port on notebook_ip {ip}: {exc.strerror or exc}") from exc
    argv = _argv(host.config.notebook_command, ip, port)
    try:
        child = subprocess.Popen(
            ["/bin/sh", "-c", WAIT_THEN_EXEC, "calque-notebook", *argv],
            user=pw.pw_uid,
            group=pw.pw_gid,
            extra_groups=os.getgrouplist(pw.pw_name, pw.pw_gid),
            env=_env(host, held, pw, _where(args.env, ip, port)),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,  # not in the daemon's process group: its signals are not the server's
        )
    except OSError as exc:
        raise RequestError("refused", f"cannot start the notebook server as {pw.pw_name}: {exc}") from exc
    assert child.stdin is not None
    try:
        host.cgroups.adopt(s.id, child.pid, props)
        live = host.registry.get(s.id)
        if live is None or live.session.ended_at is not None:  # it ended while the child was made
            raise CgroupError(f"session {s.id} ended meanwhile")
        child.stdin.write(b"go\n")
        child.stdin.close()
    except (CgroupError, OSError) as exc:
        child.kill()
        child.wait()
        host.audit.record("notebook_failed", held, by_uid=c.uid, reason=str(exc))
        raise RequestError("refused", f"cannot start the notebook server in session {s.id}: {exc}") from exc
    threading.Thread(target=child.wait, name=f"notebook-{child.pid}", daemon=True).start()  # reaps it
    log = str(Path(pw.pw_dir) / LOG_DIR / f"notebook-{s.id}.log")
    via = "hub" if c.via_hub else "broker" if c.via_broker else "self"
    host.audit.record("notebook", held, by_uid=c.uid, via=via, pid=child.pid, ip=ip, port=port, command=argv[0])
    return NotebookStarted(session_id=s.id, user=pw.pw_name, ip=ip, port=port, pid=child.pid, log=log)
