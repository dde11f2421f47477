"""The session service's core: what each request does, for a caller the kernel identified.

The socket server (``daemon.py``) parses and authenticates; this module decides. It never calls AWS
and never changes the GPU layout: it binds users to slices that already exist.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import secrets
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from calque.durations import parse_duration
from calque.errors import CalqueError
from calque.gpu.backend import GpuReader
from calque.models.session import Session, Slice, SliceState
from calque.session import isolation
from calque.session.audit import AuditLog, EventTally
from calque.session.config import Limits, SessionConfig
from calque.session.inventory import inventory, layout_stamp
from calque.session.notices import notify_terminals
from calque.session.protocol import RequestError
from calque.session.registry import Held, NoFreeSlice, Registry, TooManySessions, ts
from calque.session.requests import (
    CheckoutArgs,
    ExtendArgs,
    ReleaseArgs,
    ReportArgs,
    RequestArgs,
    SessionRefArgs,
    parse_args,
)
from calque.session.usage import usage_report

log = logging.getLogger("calque.session")

# Only for backends without a layout stamp (NVML); the simulator's layout is checked on every request.
INVENTORY_MAX_AGE_S = 2.0
IDENTITY_CACHE_S = 5.0


@dataclass(frozen=True)
class Caller:
    pid: int
    uid: int
    gid: int
    user: str
    admin: bool
    groups: frozenset[str] = frozenset()


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _groups_of(user: str, gid: int) -> set[str]:
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


def _fmt_time(d: datetime) -> str:
    return d.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


@dataclass
class Service:
    config: SessionConfig
    registry: Registry
    audit: AuditLog
    reader: GpuReader | None
    host_root: Path = Path("/")
    wake: Callable[[], None] = lambda: None
    reclaim: Callable[[Held], None] = lambda h: None
    tally: EventTally | None = None
    _slices: list[Slice] = field(default_factory=list)
    _slices_at: float = 0.0
    _slices_stamp: tuple[int, ...] | None = None
    _inv_lock: threading.Lock = field(default_factory=threading.Lock)
    _warned: set[str] = field(default_factory=set)
    nodes_lock: AbstractContextManager[Any] = field(default_factory=threading.Lock)
    _identities: dict[tuple[int, int], tuple[float, str, frozenset[str]]] = field(default_factory=dict)
    _limits: dict[tuple[str, frozenset[str]], Limits] = field(default_factory=dict)
    metrics_registry: Any = None  # prometheus_client's CollectorRegistry, made on first use (metrics.py)

    # -- who is calling ---------------------------------------------------------------------------

    def caller(self, pid: int, uid: int, gid: int) -> Caller:
        # Names and groups from NSS, cached briefly: a group change applies within IDENTITY_CACHE_S.
        now = time.monotonic()
        hit = self._identities.get((uid, gid))
        if hit is None or now - hit[0] > IDENTITY_CACHE_S:
            name = user_name(uid)
            hit = (now, name, frozenset(_groups_of(name, gid)))
            self._identities[(uid, gid)] = hit
        _, name, groups = hit
        ag = self.config.policy.admin_group
        admin = uid == 0 or (ag is not None and ag in groups)
        return Caller(pid=pid, uid=uid, gid=gid, user=name, admin=admin, groups=groups)

    def limits(self, c: Caller) -> Limits:
        # The policy is fixed for the daemon's life: one computation per (user, groups).
        key = (c.user, c.groups)
        hit = self._limits.get(key)
        if hit is None:
            if len(self._limits) >= 4096:
                self._limits.clear()
            hit = self._limits[key] = self.config.policy.limits_for(c.user, c.groups, self.config.max_total_ttl)
        return hit

    # -- inventory --------------------------------------------------------------------------------

    def slices(self, fresh: bool = False) -> list[Slice]:
        # Rebuilding the inventory reads and validates the whole GPU state: do it only when the
        # layout stamp changed (one stat), or, with no stamp, when the last read is older than
        # INVENTORY_MAX_AGE_S. The stamp is taken before the read, so a change during it is seen next time.
        with self._inv_lock:
            now = time.monotonic()
            try:
                stamp = layout_stamp(self.config)
            except OSError:
                stamp, fresh = None, True  # let the read itself report what is wrong
            if stamp is not None:
                stale = stamp != self._slices_stamp
            else:
                stale = not self._slices_at or now - self._slices_at > INVENTORY_MAX_AGE_S
            if fresh or stale:
                self._slices_stamp = None
                try:
                    self._slices = inventory(self.config, self.reader)
                except CalqueError:
                    raise
                except Exception as exc:
                    raise RequestError("internal", f"cannot read the GPU inventory: {exc}") from exc
                self._slices_at = now
                self._slices_stamp = stamp
            return list(self._slices)

    # -- operations -------------------------------------------------------------------------------

    def handle(self, c: Caller, op: str, args: dict[str, Any]) -> Any:
        typed = parse_args(op, args)  # unknown ops and keys, wrong types: refused by name
        return getattr(self, f"op_{op}")(c, typed)

    def op_ping(self, c: Caller, args: RequestArgs) -> Any:
        return {"pong": True}

    def op_whoami(self, c: Caller, args: RequestArgs) -> Any:
        return {"uid": c.uid, "gid": c.gid, "user": c.user, "admin": c.admin, "pid": c.pid}

    def op_adopt(self, c: Caller, args: SessionRefArgs) -> Any:
        from calque.session.adopt import adopt  # the caller's process into the session's cgroup

        return adopt(self, c, self._own(c, args, "run in"))

    def op_checkout(self, c: Caller, args: CheckoutArgs) -> Any:
        mps, profile, gpu, raw_ttl = args.mps, args.profile, args.gpu, args.ttl
        if mps and profile:
            raise RequestError("usage", "give either --mps or --profile, not both")
        if mps and not args.consent:
            raise RequestError(
                "refused",
                "an MPS slot shares one GPU's memory and faults with other users; "
                "pass --i-understand-shared-gpu-has-no-isolation to accept that",
            )
        lim = self.limits(c)
        assert lim.max_ttl is not None
        try:
            ttl = parse_duration(raw_ttl if raw_ttl is not None else self.config.default_ttl, what="ttl")
        except CalqueError as exc:
            raise RequestError("usage", str(exc)) from exc
        if ttl <= 0:
            raise RequestError("usage", "--ttl must be positive, e.g. 30m or 2h")
        if ttl > lim.max_ttl:
            raise RequestError("refused", f"--ttl {ttl:g} s is more than your limit of {lim.max_ttl:g} s; ask for less")
        kind = "mps" if mps else "mig"
        all_slices = self.slices()
        cands = [s for s in all_slices if s.kind == kind]
        if profile:
            cands = [s for s in cands if s.profile == profile]
        if gpu is not None:
            cands = [s for s in cands if s.gpu_index == gpu]
        if not cands:
            have = sorted({f"{s.profile} (gpu {s.gpu_index})" for s in all_slices if s.kind == kind})
            raise RequestError(
                "usage",
                f"no {kind.upper()} slice on this host matches"
                + (f" profile {profile}" if profile else "")
                + (f" gpu {gpu}" if gpu is not None else "")
                + (f"; this host has: {', '.join(have)}" if have else f"; this host has no {kind.upper()} slices"),
            )
        now = time.time()
        sid = "s-" + secrets.token_hex(5)
        expires = ts(now + ttl)
        request_id = args.request_id
        try:
            held, created = self.registry.checkout(
                cands,
                session_id=sid,
                uid=c.uid,
                gid=c.gid,
                user=c.user,
                now=now,
                ttl=ttl,
                max_sessions=lim.max_sessions,
                request_id=request_id,
                env_for=lambda s: isolation.environment(s, sid, expires),
                mps_one_user_per_daemon=self.config.mps_user_model == "serialised-per-user",
                group_limits=self.config.policy.group_limits(c.groups),
            )
        except TooManySessions as exc:
            if exc.group is not None:
                raise RequestError(
                    "refused",
                    f"group {exc.group} holds {exc.live} session(s) among its members, its limit is {exc.limit}; "
                    "wait for one of them to check in",
                ) from exc
            raise RequestError(
                "refused",
                f"you hold {exc.live} session(s), your limit is {exc.limit}; check one in first "
                "(`calque session status` lists them)",
            ) from exc
        except NoFreeSlice as exc:
            busy = "; ".join(
                f"{h.slice.id} ({h.slice.profile}, gpu {h.slice.gpu_index}) until {_fmt_time(h.session.expires_at)}"
                for h in exc.busy
            )
            if exc.other_users:
                daemons = sorted({h.slice.pipe_directory or "" for h in exc.other_users})
                until = max(h.session.expires_at for h in exc.other_users)
                busy += ("; " if busy else "") + (
                    f"free MPS slots on {', '.join(daemons)} are not offered to you while another user holds "
                    f"slots there (MPS serialises different users' clients), until {_fmt_time(until)} at the latest"
                )
            raise RequestError("busy", f"every matching slice is busy: {busy}; retry later or pass --wait") from exc
        if created:
            self._grant(held)
            self.audit.record("checkout", held, pid=c.pid)
            self.wake()
        elif held.session.ended_at is None:
            self._grant(held)  # a retried request: the first answer may have been lost in a crash
        return self._view(held).model_dump(mode="json")

    def _grant(self, held: Held) -> None:
        try:
            with self.nodes_lock:
                warnings = isolation.grant(self.host_root, held.slice, held.session.uid)
            for w in warnings:
                if w not in self._warned:  # once per node, not once per checkout
                    self._warned.add(w)
                    log.warning("%s", w)
        except (OSError, ValueError) as exc:
            # A session whose isolation failed must not stand: undo it and tell the caller.
            self.registry.end(held.session.id, "vanished", time.time())
            raise RequestError(
                "internal",
                f"cannot hand {held.slice.id} to you: capability nodes: {exc}; an admin must check the MIG setup",
            ) from exc

    def reassert_nodes(self) -> None:
        """Holders' nodes back to them, free MIG slices' nodes back to root alone (the driver creates
        new ones world-readable, 0444, and may reset modes). Reads the registry under the node lock,
        so a concurrent check-in or checkout is never undone."""
        try:
            slices = self.slices()
        except RequestError as exc:
            log.error("cannot list slices to secure them: %s", exc)
            return
        with self.nodes_lock:
            holders = {h.session.slice_id: h.session.uid for h in self.registry.live()}
            for sl in slices:
                if sl.kind != "mig":
                    continue
                try:
                    if sl.id in holders:
                        isolation.grant(self.host_root, sl, holders[sl.id])
                    else:
                        isolation.revoke(self.host_root, sl)
                except (OSError, ValueError) as exc:
                    log.error("cannot re-assert capability nodes of %s: %s", sl.id, exc)

    def _view(self, held: Held) -> Session:
        s = held.session.model_copy()
        s.spot = self.config.spot
        if self.config.spot:
            s.warnings = [
                "this host is a spot instance: an interruption ends every tenant's session without notice "
                "beyond the 2-minute spot warning; save your work often"
            ]
        return s

    def _own(self, c: Caller, args: SessionRefArgs, verb: str) -> Held:
        sid = args.id
        if sid is None:
            mine = self.registry.live(c.uid)
            if len(mine) == 1:
                return mine[0]
            if not mine:
                raise RequestError("not_found", "you hold no session")
            raise RequestError(
                "usage", f"you hold {len(mine)} sessions ({', '.join(h.session.id for h in mine)}); name one to {verb}"
            )
        held = self.registry.get(sid)
        if held is None or held.session.ended_at is not None:
            raise RequestError("not_found", f"no live session {sid}; `calque session status` lists yours")
        if held.session.uid != c.uid:
            raise RequestError("forbidden", f"session {sid} is not yours; you can only {verb} your own sessions")
        return held

    def end(
        self, sid: str, reason: str, event: str, by_uid: int, note: str | None = None, owner: int | None = None
    ) -> Held | None:
        """End a live session (only if ``owner``'s, when given, checked in the same transaction)."""
        ended = self.registry.end(sid, reason, time.time(), owner=owner)  # type: ignore[arg-type]
        if ended is None:
            return None
        try:
            with self.nodes_lock:
                isolation.revoke(self.host_root, ended.slice)
        except (OSError, ValueError) as exc:
            log.error("cannot take back capability nodes of %s: %s", ended.slice.id, exc)
        self.audit.record(event, ended, by_uid=by_uid, reason=note or reason)
        return ended

    def op_checkin(self, c: Caller, args: SessionRefArgs) -> Any:
        # A named session is ended only if it is the caller's, checked in the transaction that ends it
        # (no read before it); when that ends nothing, _own says why.
        sid = args.id if args.id is not None else self._own(c, args, "check in").session.id
        ended = self.end(sid, "checkin", "checkin", c.uid, owner=c.uid)
        if ended is None:
            self._own(c, args, "check in")
            raise RequestError("not_found", f"session {sid} already ended")
        self.reclaim(ended)
        return ended.session.model_dump(mode="json")

    def op_extend(self, c: Caller, args: ExtendArgs) -> Any:
        held = self._own(c, args, "extend")
        if held.expires <= time.time():
            raise RequestError("refused", f"session {held.session.id} has expired and is being reclaimed")
        try:
            by = parse_duration(args.by, what="by")
        except CalqueError as exc:
            raise RequestError("usage", str(exc)) from exc
        if by <= 0:
            raise RequestError("usage", "--by must be positive, e.g. 30m")
        lim = self.limits(c)
        assert lim.max_ttl is not None
        new = held.expires + by
        cap = held.created + lim.max_ttl
        if new > cap + 1e-6:
            room = max(0.0, cap - held.expires)
            raise RequestError(
                "refused",
                f"a session may last at most {lim.max_ttl:g} s in total; you can extend {held.session.id} "
                f"by at most {room:.0f} s more",
            )
        ext = self.registry.extend(held.session.id, new)
        if ext is None:
            raise RequestError("not_found", f"session {held.session.id} already ended")
        self.audit.record("extend", ext, by_seconds=by)
        self.wake()
        return self._view(ext).model_dump(mode="json")

    def op_status(self, c: Caller, args: RequestArgs) -> Any:
        return [self._view(h).model_dump(mode="json") for h in self.registry.live(c.uid)]

    def op_list(self, c: Caller, args: RequestArgs) -> Any:
        live = {h.session.slice_id: h for h in self.registry.live()}
        out = []
        for sl in self.slices():
            h = live.get(sl.id)
            st = SliceState(slice=sl, busy=h is not None, busy_until=h.session.expires_at if h else None)
            if h is not None and (c.admin or h.session.uid == c.uid):
                st.holder, st.holder_uid, st.session_id = h.session.user, h.session.uid, h.session.id
            out.append(st.model_dump(mode="json"))
        return out

    def op_release(self, c: Caller, args: ReleaseArgs) -> Any:
        if not c.admin:
            ag = self.config.policy.admin_group
            raise RequestError(
                "forbidden", "only root" + (f" or members of {ag}" if ag else "") + " may force-release a session"
            )
        if not args.force:
            raise RequestError("usage", "release ends another user's session; pass --force")
        sid = args.id
        held = self.registry.get(sid)
        if held is None or held.session.ended_at is not None:
            raise RequestError("not_found", f"no live session {sid}")
        why = "released" + (f": {args.reason}" if args.reason else "")
        ended = self.end(sid, "layout" if args.reason == "layout" else "released", "release", c.uid, note=why)
        if ended is None:
            raise RequestError("not_found", f"session {sid} already ended")
        self.reclaim(ended)
        notify_terminals(ended.session.uid, f"an administrator ended session {sid} on {ended.slice.id} ({why})")
        return ended.session.model_dump(mode="json")

    def op_report(self, c: Caller, args: ReportArgs) -> Any:
        try:
            since_s = parse_duration(args.since, what="since")
        except CalqueError as exc:
            raise RequestError("usage", str(exc)) from exc
        until = datetime.now(timezone.utc)
        since = ts(until.timestamp() - since_s)
        return usage_report(self.registry, since, until, None if c.admin else c.uid).model_dump(mode="json")

    def op_metrics(self, c: Caller, args: RequestArgs) -> Any:
        from calque.session.metrics import registry_of, render  # prometheus_client only where metrics are read

        return render(registry_of(self))

    def reconcile(self) -> None:
        """After a (re)start: holders keep their nodes, free slices go back to root, vanished slices end."""
        slices = {s.id: s for s in self.slices(fresh=True)}
        live = self.registry.live()
        held_ids = set()
        for h in live:
            if h.session.slice_id not in slices:
                log.warning("slice %s of session %s is gone from the GPU; ending it", h.session.slice_id, h.session.id)
                self.end(h.session.id, "vanished", "vanished", 0)
                continue
            held_ids.add(h.session.slice_id)
            try:
                isolation.grant(self.host_root, h.slice, h.session.uid)
            except (OSError, ValueError) as exc:
                log.error("cannot re-grant %s to uid %d: %s", h.slice.id, h.session.uid, exc)
        for sid, sl in slices.items():
            if sid in held_ids:
                continue
            try:
                isolation.revoke(self.host_root, sl)
            except (OSError, ValueError) as exc:
                log.error("cannot secure capability nodes of %s: %s", sid, exc)
