"""A local user's group names, as the host's NSS answers: who a caller is for the session daemon's
policy and labs (``daemon/identity.py``) and for the broker's (``broker/callers.py``)."""

from __future__ import annotations

import grp
import os


def groups_of(user: str, gid: int) -> set[str]:
    """The names of ``user``'s groups, ``gid`` among them; a group without a name is left out."""
    names = set()
    try:
        gids = os.getgrouplist(user, gid)
    except (KeyError, OSError):
        gids = [gid]
    for g in gids:
        try:
            names.add(grp.getgrgid(g).gr_name)
        except KeyError:
            continue
    return names
