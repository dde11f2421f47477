"""Who is calling the broker: a uid the kernel (SO_PEERCRED) or munge vouched for, with the name,
groups and lab this host's NSS gives it. No request carries a user name."""

from __future__ import annotations

import pwd
from collections.abc import Mapping
from dataclasses import dataclass

from calque.errors import RefusedError
from calque.session.broker.fairness import lab_of
from calque.session.unix_groups import groups_of


@dataclass(frozen=True)
class Caller:
    uid: int
    gid: int
    user: str
    groups: frozenset[str]
    lab: str
    admin: bool


def caller(uid: int, gid: int, *, labs: Mapping[str, frozenset[str]], admin_group: str | None) -> Caller:
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError as exc:
        raise RefusedError(
            f"uid {uid} has no name on the front-door host; the broker acts for named users only"
        ) from exc
    groups = frozenset(groups_of(name, gid))
    admin = uid == 0 or (admin_group is not None and admin_group in groups)
    return Caller(uid=uid, gid=gid, user=name, groups=groups, lab=lab_of(groups, labs), admin=admin)
