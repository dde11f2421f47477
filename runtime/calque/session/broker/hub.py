"""The institution's JupyterHub as a caller of the broker: the one identity besides the broker's own
that may name another user (``as_user``), and only to do for her what she could do herself when she
opens a notebook: ask for a slice (``anywhere``), see her requests' places (``queue``) and cancel one,
and see her lab's budget left (``lab``, for the options form).
Her session's state, her server and her check-in it asks of the session's host (``daemon/crosshost.py``).

The hub is named in ``institution.yaml`` (``hub.service_user``); its uid comes from SO_PEERCRED or
munge, never from the request. The user it names is then the caller, with her own groups, lab,
limits and budget: the hub grants nothing she would not get. Every request in someone else's name
is written to the broker's audit log, granted or refused.
"""

from __future__ import annotations

import pwd
from collections.abc import Callable, Mapping
from typing import Any

from calque.errors import RefusedError
from calque.session.broker.callers import Caller, caller

HUB_BROKER_OPS = frozenset({"anywhere", "queue", "cancel", "lab"})


def acting_for(
    c: Caller,
    as_user: str,
    op: str,
    *,
    hub_user: str | None,
    labs: Mapping[str, frozenset[str]],
    admin_group: str | None,
    audit: Callable[..., Any] | None = None,
) -> Caller:
    """The caller the broker serves when ``c`` names ``as_user``: that user, if ``c`` is the hub and
    ``op`` one of its few; a RefusedError (exit 4) otherwise, audited either way."""
    why = None
    if hub_user is None or c.user != hub_user:
        who = f"the institution's hub ({hub_user})" if hub_user else "no one (institution.yaml names no hub)"
        why = f"{c.user} may not act for {as_user}: only {who} may name another user"
    elif op not in HUB_BROKER_OPS:
        why = f"the hub may ask only {', '.join(sorted(HUB_BROKER_OPS))} for another user, not {op}"
    if why is not None:
        if audit is not None:
            audit("hub_refused", uid=c.uid, user=c.user, as_user=as_user, op=op, message=why)
        raise RefusedError(why)

    try:
        pw = pwd.getpwnam(as_user)
    except KeyError:
        raise RefusedError(f"no user {as_user} on the front-door host") from None
    if audit is not None:
        audit("hub_request", uid=c.uid, user=c.user, as_user=as_user, op=op)
    return caller(pw.pw_uid, pw.pw_gid, labs=labs, admin_group=admin_group)
