"""Who is calling: the uid, gid and pid SO_PEERCRED reported, with the name and groups NSS gives them.

No request carries a user name; names and groups are cached briefly (IDENTITY_CACHE_S), so a group
change applies within that long. A policy's limits are fixed for the daemon's life: one computation
per (user, groups).
"""

from __future__ import annotations

import pwd
import time
from dataclasses import dataclass

from calque.session.session_config import Limits, SessionConfig
from calque.session.unix_groups import groups_of

IDENTITY_CACHE_S = 5.0


@dataclass(frozen=True)
class Caller:
    pid: int
    uid: int
    gid: int
    user: str
    admin: bool
    groups: frozenset[str] = frozenset()
    via_broker: bool = False  # the institution's broker asked for this user (``door.py``)
    via_hub: bool = False  # the institution's JupyterHub asked for this user (``notebook`` and its few ops only)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class Identities:
    """Callers and their limits under ``config``'s policy."""

    def __init__(self, config: SessionConfig) -> None:
        self._config = config
        self._identities: dict[tuple[int, int], tuple[float, str, frozenset[str]]] = {}
        self._limits: dict[tuple[str, frozenset[str]], Limits] = {}

    def caller(self, pid: int, uid: int, gid: int) -> Caller:
        now = time.monotonic()
        hit = self._identities.get((uid, gid))
        if hit is None or now - hit[0] > IDENTITY_CACHE_S:
            name = user_name(uid)
            hit = (now, name, frozenset(groups_of(name, gid)))
            self._identities[(uid, gid)] = hit
        _, name, groups = hit
        ag = self._config.policy.admin_group
        admin = uid == 0 or (ag is not None and ag in groups)
        return Caller(pid=pid, uid=uid, gid=gid, user=name, admin=admin, groups=groups)

    def limits(self, c: Caller) -> Limits:
        key = (c.user, c.groups)
        hit = self._limits.get(key)
        if hit is None:
            if len(self._limits) >= 4096:
                self._limits.clear()
            cfg = self._config
            hit = self._limits[key] = cfg.policy.limits_for(c.user, c.groups, cfg.max_total_ttl)
        return hit
