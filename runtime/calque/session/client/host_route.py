"""One op on a named host's daemon, wherever that host is: this machine's through its unix socket, any
other host of ``institution.yaml`` over TCP with a munge credential this very process makes, so the
host knows the caller by uid and decides by its own groups what they may do (``calque session drain``,
``undrain`` and ``drains`` take a HOST)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any


def is_this_host(host: str | None) -> bool:
    """Whether ``host`` (None: no host named) is this machine, by its short or full name."""
    if host is None:
        return True
    here = socket.gethostname()
    return host in (here, here.split(".", 1)[0], socket.getfqdn())


def call_on_host(
    host: str | None,
    op: str,
    args: dict[str, Any],
    *,
    socket_path: Path,
    institution: Path,
    munge_socket: Path | None,
) -> Any:
    """``op`` on HOST's daemon: the local socket, or the institution's TCP path with munge; a HOST the
    institution file does not name is a UsageError listing the ones it does."""
    if is_this_host(host):
        from calque.session.client.connection import SessionClient

        return SessionClient(socket_path).call(op, **args)
    from calque.errors import UsageError
    from calque.session.institution import load_institution
    from calque.session.remote import RemoteHost, new_request_id

    assert host is not None
    known = load_institution(institution)
    entry = known.host(host)
    if entry is None:
        names = ", ".join(h.name for h in known.hosts) or "none"
        raise UsageError(f"{host} is neither this host nor one of {institution}'s hosts ({names})")
    remote = RemoteHost(entry.name, entry.address, entry.port, munge_socket=munge_socket)
    return remote.call(op, args, request_id=new_request_id())
