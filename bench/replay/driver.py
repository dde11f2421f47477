"""Replaying the requests: one process per lab, running as that lab's Unix user, each request a thread
that joins the real broker's queue (``checkout --anywhere --wait`` over its unix socket) at its arrival,
keeps its slice busy for its hold (the simulator's utilisation on it set to 100 %, then 0 %: the
parent, as root, writes the hosts' simulated GPUs for it), and then, per the holder model
(``holders.py``), checks it in through the broker (``on_host``) or leaves it to its TTL."""

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

from .holders import read_ends
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
    host: str | None = None
    session: str | None = None
    busy_until: float | None = None  # its work's end (granted + hold)
    booked_until: float | None = None  # when its TTL ends (granted + booked)
    ended_by: str | None = None  # the host's audit trail: checkin, expiry, idle, ...


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


def _one(sock: Path, req: Request, t0: float, end: float, out: list[Outcome], rid: str, loads: Any) -> None:
    from calque.models.broker import AnywhereArgs
    from calque.session.client.broker import BrokerClient

    time.sleep(max(0.0, t0 + req.arrival - time.time()))
    o = Outcome(rid, req.lab, req.profile, time.time() - t0, None, None)
    out.append(o)
    broker = BrokerClient(sock)
    prompt = req.booked <= req.hold
    # a prompt holder checks in at its hold's end (the TTL a backstop); a booked one leaves it to the TTL
    ttl = f"{math.ceil(req.hold) + 5}s" if prompt else f"{math.ceil(req.booked)}s"
    try:
        g = broker.anywhere(AnywhereArgs(profile=req.profile, ttl=ttl, wait=True, request_id=rid))
    except Exception as exc:  # cancelled at the window's end, or refused: recorded, not fatal
        o.error = str(exc)[:200]
        return
    o.granted = time.time() - t0
    o.host, o.session = g.host, g.session.id
    o.busy_until, o.booked_until = o.granted + req.hold, o.granted + (req.hold if prompt else req.booked)
    device = g.session.env.get("CUDA_VISIBLE_DEVICES", "")
    loads.put((g.host, device, g.session.id, 100.0))
    time.sleep(max(0.0, min(t0 + o.busy_until, t0 + end) - time.time()))
    loads.put((g.host, device, g.session.id, 0.0))
    if not prompt:
        time.sleep(max(0.0, min(t0 + o.booked_until, t0 + end) - time.time()))
    o.released = time.time() - t0
    if prompt or o.released >= end - 0.01:  # the window's end: whatever is still held is checked in
        try:
            broker.on_host(g.ref, "checkin")
        except Exception as exc:
            if prompt:  # a booked holder's session may have been ended already (its TTL, or reclaim)
                o.error = f"checkin: {exc}"[:200]
        o.released = time.time() - t0


def _lab(
    sock: str, user: LabUser, reqs: list[Request], t0: float, end: float, grace: float, q: Any, loads: Any
) -> None:
    from calque.session.client.broker import BrokerClient

    _become(user)
    out: list[Outcome] = []
    rids = [f"replay-{user.lab}-{i:06d}" for i in range(len(reqs))]
    threads = [
        threading.Thread(target=_one, args=(Path(sock), r, t0, end, out, rid, loads), daemon=True)
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


def _loader(loads: Any, hosts: dict[str, Path]) -> None:
    """As root: each holder's busy/idle on its slice, written to its host's simulated GPU. A message
    from a session that no longer holds the device is dropped (its slice may be someone else's now)."""
    from calque.gpu.sim import SimGpu

    sims = {h: SimGpu(p) for h, p in hosts.items()}
    owner: dict[tuple[str, str], str] = {}
    while (msg := loads.get()) is not None:
        host, device, sid, util = msg
        if util > 0:
            owner[(host, device)] = sid
        elif owner.get((host, device)) != sid:
            continue
        with contextlib.suppress(Exception):  # a device the sim does not know: no load, and no crash
            sims[host].set_load(device, util)


def replay(
    sock: Path,
    users: dict[str, LabUser],
    requests: list[Request],
    replay_s: float,
    hosts: dict[str, Path],
    grace: float = 0.0,
) -> list[Outcome]:
    """``hosts``: each host's directory (its simulated GPU's ``gpus.json`` and its ``audit.jsonl``)."""
    ctx = mp.get_context("fork")
    q: Any = ctx.Queue()
    loads: Any = ctx.Queue()
    loader = threading.Thread(target=_loader, args=(loads, {h: d / "gpus.json" for h, d in hosts.items()}))
    loader.start()
    t0 = time.time() + LEAD_S
    procs = []
    try:
        for lab, user in users.items():
            mine = [r for r in requests if r.lab == lab]
            p = ctx.Process(target=_lab, args=(str(sock), user, mine, t0, replay_s, grace, q, loads))
            p.start()
            procs.append(p)
        got: list[Outcome] = []
        for _ in procs:
            got += [Outcome(**o) for o in q.get(timeout=replay_s + grace + 300)]
        for p in procs:
            p.join(30)
    finally:
        loads.put(None)
        loader.join(30)
    _ends(got, hosts, t0)
    return got


def _ends(outs: list[Outcome], hosts: dict[str, Path], t0: float) -> None:
    """Each granted session's end as its host recorded it; a session idle reclaim ended was released then."""
    ends = {h: read_ends(d / "audit.jsonl") for h, d in hosts.items()}
    for o in outs:
        if o.host is None or o.session is None or (e := ends.get(o.host, {}).get(o.session)) is None:
            continue
        o.ended_by = e.event
        if e.event == "idle":
            o.released = min(o.released if o.released is not None else e.at - t0, e.at - t0)
