"""``adopt``: the daemon moves the caller into its session's cgroup (as pam_slurm_adopt does).

The pid comes from SO_PEERCRED, never from the request; it is adopted only while it still belongs
to the uid the kernel reported for the connection (a pid that exited and was reused by another user
is refused), and only into a session that uid holds.
"""

from __future__ import annotations

from typing import Any

from calque.session.daemon import devices
from calque.session.daemon.cgroup import CgroupError
from calque.session.daemon.host import Host
from calque.session.daemon.identity import Caller
from calque.session.daemon.inventory import owner_of
from calque.session.daemon.rows import Held
from calque.session.daemon.wire import RequestError


def adopt(host: Host, c: Caller, held: Held) -> Any:
    if owner_of(c.pid) != c.uid:
        raise RequestError(
            "forbidden", f"pid {c.pid} is not a process of uid {c.uid} (any more); run from your own shell"
        )
    try:
        props = devices.scope_properties(host.root, held.slice)
    except (OSError, ValueError) as exc:  # the slice's capability nodes are gone (a layout change under it)
        raise RequestError(
            "refused", f"cannot list the devices of {held.slice.id}: {exc}; an admin must check the MIG setup"
        ) from exc
    try:
        where = host.cgroups.adopt(held.session.id, c.pid, props)
    except CgroupError as exc:
        raise RequestError("refused", f"cannot start work inside session {held.session.id}: {exc}") from exc
    view = held.session.model_dump(mode="json")
    return {"session": view, "env": held.session.env, "cgroup": str(where)}
