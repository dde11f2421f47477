"""Replaying the requests: one process per lab, running as that lab's Unix user, each request a thread
that joins the real broker's queue (``checkout --anywhere --wait`` over its unix socket) at its arrival,
holds the slice it is granted for its hold, and checks it in through the broker (``on_host``)."""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .launch import LabUser
from .mapping import Request

LEAD_S = 2.0  # the lab processes start this long before the window's first second


@dataclass
class Outcome:
    rid: str
    lab: str
    profile: str
    arrival: float  # replay seconds after the window's start, as measured
    granted: float | None  # None: still queued when the window ended, or refused
    released: float | None
    error: str | None = None
    queued_at_end: bool = False  # cancelled by the replay when the window ended: its wait is censored


def _become(user: LabUser) -> None:
    os.setgroups([user.gid, *([g] if (g := _gid(user.group)) else [])])
    os.setgid(user.gid)
    os.setuid(user.uid)


def _gid(group: str) -> int | None:
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def _one(sock: Path, req: Request, t0: float, end: float, out: list[Outcome], rid: str) -> None:
    from calque.models.broker import AnywhereArgs
    from calque.session.client.broker import BrokerClient

    time.sleep(max(0.0, t0 + req.arrival - time.time()))
    o = Outcome(rid, req.lab, req.profile, time.time() - t0, None, None)
    out.append(o)
    broker = BrokerClient(sock)
    ttl = f"{math.ceil(req.hold) + 5}s"  # the holder checks in at its hold's end; the TTL is a backstop
    try:
        g = broker.anywhere(AnywhereArgs(profile=req.profile, ttl=ttl, wait=True, request_id=rid))
    except Exception as exc:  # cancelled at the window's end, or refused: recorded, not fatal
        o.error = str(exc)[:200]
        return
    o.granted = time.time() - t0
    time.sleep(max(0.0, min(t0 + o.granted + req.hold, t0 + end) - time.time()))
    try:
        broker.on_host(f"{g.session.id}@{g.host}", "checkin")
    except Exception as exc:
        o.error = f"checkin: {exc}"[:200]
    o.released = time.time() - t0


def _lab(sock: str, user: LabUser, reqs: list[Request], t0: float, end: float, grace: float, q: Any) -> None:
    from calque.session.client.broker import BrokerClient

    _become(user)
    out: list[Outcome] = []
    rids = [f"replay-{user.lab}-{i:06d}" for i in range(len(reqs))]
    threads = [
        threading.Thread(target=_one, args=(Path(sock), r, t0, end, out, rid), daemon=True)
        for r, rid in zip(reqs, rids, strict=True)
    ]
    for t in threads:
        t.start()
    time.sleep(max(0.0, t0 + end - time.time()))
    # --grace: requests still queued at the window's end may wait this much longer for their grant
    # (a test waits for the grant itself rather than racing the window's end); 0 in a figure's run.
    while time.time() < t0 + end + grace and any(o.granted is None and o.error is None for o in out):
        time.sleep(0.05)
    broker = BrokerClient(Path(sock))
    for o in list(out):
        if o.granted is None and o.error is None:
            o.queued_at_end = True
            with contextlib.suppress(Exception):  # it may have been granted meanwhile
                broker.cancel(o.rid)  # still queued at the window's end: its wait is counted up to the end
    for t in threads:
        t.join(30)
    q.put([asdict(o) for o in out])


def replay(
    sock: Path, users: dict[str, LabUser], requests: list[Request], replay_s: float, grace: float = 0.0
) -> list[Outcome]:
    ctx = mp.get_context("fork")
    q: Any = ctx.Queue()
    t0 = time.time() + LEAD_S
    procs = []
    for lab, user in users.items():
        mine = [r for r in requests if r.lab == lab]
        p = ctx.Process(target=_lab, args=(str(sock), user, mine, t0, replay_s, grace, q))
        p.start()
        procs.append(p)
    got: list[Outcome] = []
    for _ in procs:
        got += [Outcome(**o) for o in q.get(timeout=replay_s + grace + 300)]
    for p in procs:
        p.join(30)
    return got
