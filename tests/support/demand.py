"""Scripted session histories written into a real registry by the daemon's own Registry calls.

``fortnight`` checks slices out and in at scripted times (``now=`` of each call) and asks for slices
while every matching one is held, so the refusals are recorded by the checkout's own transaction,
exactly as the daemon records them. The registry is made today; ``began_recording`` moves its
``demand_recorded_since`` to the history's start, as for a registry that has been running since.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from calque.gpu.sim import SimGpu
from calque.models.session import Slice
from calque.session.daemon.demand import Ask
from calque.session.daemon.registry import Registry
from calque.session.daemon.rows import NoFreeSlice

DAY = 86400.0


def slices_of(sim: SimGpu) -> list[Slice]:
    """The sim's MIG devices as the session inventory names them (one slice per MIG device)."""
    gpus = {g.index: g.uuid for g in sim.gpus()}
    return [
        Slice(
            id=d.uuid, kind="mig", gpu_index=d.gpu_index, gpu_uuid=gpus[d.gpu_index], profile=d.profile, mig_uuid=d.uuid
        )
        for d in sim.mig_devices()
    ]


def _checkout(reg: Registry, cands: Sequence[Slice], sid: str, uid: int, now: float, ask: Ask) -> bool:
    try:
        reg.checkout(
            cands, session_id=sid, uid=uid, gid=uid, user=f"u{uid}", now=now, ttl=12 * 3600.0,
            max_sessions=None, request_id=None, env_for=lambda s: {}, ask=ask,
        )  # fmt: skip
    except NoFreeSlice:
        return False
    return True


def fortnight(
    path: Path,
    slices: Sequence[Slice],
    start: float,
    *,
    days: int = 14,
    refused_per_day: dict[str, int] | None = None,
    in_use: dict[str, int] | None = None,
) -> Registry:
    """Each day from 09:00 to 17:00 (hours after ``start``): ``in_use[profile]`` sessions of each profile
    (default: every slice of it), and at 10:00 ``refused_per_day[profile]`` further asks, refused while
    they are all held. Returns the open registry."""
    reg = Registry(path)
    by_profile: dict[str, list[Slice]] = {}
    for sl in slices:
        by_profile.setdefault(sl.profile, []).append(sl)
    n = 0
    for day in range(days):
        t0 = start + day * DAY
        live = []
        for profile, sls in sorted(by_profile.items()):
            for k, sl in enumerate(sls[: (in_use or {}).get(profile, len(sls))]):
                n += 1
                sid = f"s-{n:05d}"
                assert _checkout(reg, [sl], sid, 2000 + k, t0 + 9 * 3600, Ask("mig", profile))
                live.append(sid)
        for profile, count in sorted((refused_per_day or {}).items()):
            for j in range(count):
                n += 1
                assert not _checkout(
                    reg, by_profile[profile], f"s-{n:05d}", 3000 + j, t0 + 10 * 3600, Ask("mig", profile)
                )
        for sid in live:
            reg.end(sid, "checkin", t0 + 17 * 3600)
    return reg


def began_recording(path: Path, at: float) -> None:
    db = sqlite3.connect(path)
    db.execute("UPDATE registry_meta SET value=? WHERE key='demand_recorded_since'", (repr(at),))
    db.commit()
    db.close()
