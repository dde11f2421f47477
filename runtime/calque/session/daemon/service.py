"""The session service: what each request does, for a caller the kernel identified.

The listener (``listener.py``) parses and authenticates; this module decides, over the host it is
handed (``host.py``) and the clean-up that runs after a session ends (``cleanup.py``). It never calls
AWS and never changes the GPU layout: it binds users to slices that already exist.
"""

from __future__ import annotations

import dataclasses
import pwd
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from calque.durations import parse_duration
from calque.models.notebook import NotebookArgs
from calque.models.session import (
    BudgetElsewhereArgs,
    BudgetOverrideArgs,
    CheckoutArgs,
    DrainArgs,
    Drained,
    EndReason,
    ExtendArgs,
    LedgerArgs,
    ReleaseArgs,
    ReportArgs,
    RequestArgs,
    SessionRefArgs,
    SliceState,
    UndrainArgs,
)
from calque.session.daemon import drains
from calque.session.daemon.checkout import checkout, view
from calque.session.daemon.cleanup import Cleanup
from calque.session.daemon.daemon_ledger import budget_gate, session_lab
from calque.session.daemon.door import Door
from calque.session.daemon.host import Host
from calque.session.daemon.identity import Caller, Identities
from calque.session.daemon.nodes import end_session
from calque.session.daemon.notices import notify_terminals
from calque.session.daemon.requests import parse_args
from calque.session.daemon.rows import Held, covering
from calque.session.daemon.usage import usage_report
from calque.session.daemon.wire import RequestError
from calque.timefmt import utc_moment, utc_text

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


class Service:
    def __init__(self, host: Host, cleanup: Cleanup) -> None:
        self.host = host
        self.cleanup = cleanup
        self.identities = Identities(host.config)
        self.door = Door(host.config, host.audit)
        self._metrics: dict[bool, CollectorRegistry] = {}  # made on first use: holders shown or not

    def caller(self, pid: int, uid: int, gid: int) -> Caller:
        return self.identities.caller(pid, uid, gid)

    def from_broker(self, c: Caller, as_user: str | None) -> Caller:
        """A request on the unix socket marked as the broker's: only its service user may send one; it
        acts for ``as_user`` (None: for itself, a listing)."""
        if not self.door.is_broker(c.uid):
            self.host.audit.event("broker_refused", uid=c.uid, user=c.user, as_user=as_user)
            raise RequestError("forbidden", "only the institution's broker (its service user) speaks as the broker")
        self.door.heard()
        if as_user is None:
            return dataclasses.replace(c, via_broker=True)
        try:
            pw = pwd.getpwnam(as_user)
        except KeyError:
            raise RequestError("forbidden", f"no user {as_user} on this host") from None
        return dataclasses.replace(self.caller(0, pw.pw_uid, pw.pw_gid), via_broker=True)

    def handle(self, c: Caller, op: str, args: dict[str, Any]) -> Any:
        typed = parse_args(op, args)  # unknown ops and keys, wrong types, broken rules: refused by name
        return getattr(self, f"op_{op}")(c, typed)

    def op_ping(self, c: Caller, args: RequestArgs) -> Any:
        return {"pong": True}

    def op_whoami(self, c: Caller, args: RequestArgs) -> Any:
        return {"uid": c.uid, "gid": c.gid, "user": c.user, "admin": c.admin, "pid": c.pid}

    def op_adopt(self, c: Caller, args: SessionRefArgs) -> Any:
        from calque.session.daemon.adopt import adopt  # the caller's process into the session's cgroup

        return adopt(self.host, c, self._own(c, args, "run in"))

    def op_notebook(self, c: Caller, args: NotebookArgs) -> Any:
        from calque.session.daemon.notebook import start_notebook  # the host's one command, as the holder

        return start_notebook(self.host, c, self._own(c, args, "start a notebook in"), args).model_dump(mode="json")

    def op_checkout(self, c: Caller, args: CheckoutArgs) -> Any:
        door = self._door(c, args)
        return checkout(self.host, self.identities, c, args, door=door).model_dump(mode="json")

    def _door(self, c: Caller, args: CheckoutArgs) -> str:
        """How this checkout passes the door (``door.py``), for its audit record; refused while the
        broker answers unless the broker (or its service user) asks, or an admin overrides."""
        if c.via_broker:
            return "broker"
        if self.door.is_broker(c.uid):
            return "service_user"
        if args.direct:
            if c.user not in self.host.config.direct_users:
                self._admin(c, "check out past the institution's queue (--direct)")
            return "override"
        state = self.door.state()
        if state.mode == "queue":
            raise RequestError("refused", self.door.refusal(state))
        return state.mode

    def op_door(self, c: Caller, args: RequestArgs) -> Any:
        return self.door.state().model_dump(mode="json")

    def _own(self, c: Caller, args: SessionRefArgs, verb: str) -> Held:
        sid = args.id
        registry = self.host.registry
        if sid is None:
            mine = registry.live(c.uid)
            if len(mine) == 1:
                return mine[0]
            if not mine:
                raise RequestError("not_found", "you hold no session")
            raise RequestError(
                "usage", f"you hold {len(mine)} sessions ({', '.join(h.session.id for h in mine)}); name one to {verb}"
            )
        held = registry.get(sid)
        if held is None or held.session.ended_at is not None:
            raise RequestError("not_found", f"no live session {sid}; `calque session status` lists yours")
        if held.session.uid != c.uid:
            raise RequestError("forbidden", f"session {sid} is not yours; you can only {verb} your own sessions")
        return held

    def op_checkin(self, c: Caller, args: SessionRefArgs) -> Any:
        # A named session is ended only if it is the caller's, checked in the transaction that ends it
        # (no read before it); when that ends nothing, _own says why.
        sid = args.id if args.id is not None else self._own(c, args, "check in").session.id
        ended = end_session(self.host, sid, "checkin", "checkin", c.uid, owner=c.uid)
        if ended is None:
            self._own(c, args, "check in")
            raise RequestError("not_found", f"session {sid} already ended")
        self.cleanup.after_end(ended)
        return ended.session.model_dump(mode="json")

    def op_extend(self, c: Caller, args: ExtendArgs) -> Any:
        held = self._own(c, args, "extend")
        if held.expires <= time.time():
            raise RequestError("refused", f"session {held.session.id} has expired and is being reclaimed")
        if not c.admin:  # the checkout's gate and sentence: a lab at 100 % keeps nothing alive by extending
            budget_gate(self.host, c, None, session_lab(self.host, held.session.id, c))
        by = parse_duration(args.by, what="by")  # positive: checked by ExtendArgs
        lim = self.identities.limits(c)
        assert lim.max_ttl is not None
        new = held.expires + by
        drain = drains.drain_covering(self.host.registry, held.slice.gpu_index)
        if drain is not None and drain.deadline is not None and new > drain.deadline.timestamp() + 1e-6:
            raise RequestError("refused", f"{drain.describe()}; session {held.session.id} cannot be extended past it")
        cap = held.created + lim.max_ttl
        if new > cap + 1e-6:
            room = max(0.0, cap - held.expires)
            raise RequestError(
                "refused",
                f"a session may last at most {lim.max_ttl:g} s in total; you can extend {held.session.id} "
                f"by at most {room:.0f} s more",
            )
        ext = self.host.registry.extend(held.session.id, new)
        if ext is None:
            raise RequestError("not_found", f"session {held.session.id} already ended")
        self.host.audit.record("extend", ext, by_seconds=by)
        self.host.timers_due.set()
        return view(self.host, ext).model_dump(mode="json")

    def op_status(self, c: Caller, args: SessionRefArgs) -> Any:
        if args.id is not None:  # one of hers by id, live or ended: how it ended (the hub's poll says why)
            held = self.host.registry.get(args.id)
            if held is None or held.session.uid != c.uid:
                return []
            return [(held.session if held.session.ended_at else view(self.host, held)).model_dump(mode="json")]
        return [view(self.host, h).model_dump(mode="json") for h in self.host.registry.live(c.uid)]

    def op_list(self, c: Caller, args: RequestArgs) -> Any:
        held = self.host.registry.live()
        live = {h.session.slice_id: h for h in held}
        # The rule checkout applies (registry.checkout): with serialised-per-user MPS, a free slot on a
        # control daemon another user holds a slot of is refused to this caller; say so here first.
        foreign: dict[str, Held] = {}
        if self.host.config.mps_user_model == "serialised-per-user":
            for x in sorted(held, key=lambda y: y.session.expires_at):  # the last to end stays
                pipe = x.slice.pipe_directory
                if x.slice.kind == "mps" and pipe and x.session.uid != c.uid:
                    foreign[pipe] = x
        out = []
        drained = drains.listed(self.host.registry)
        for sl in self.host.inventory.slices():
            h = live.get(sl.id)
            st = SliceState(slice=sl, busy=h is not None, busy_until=h.session.expires_at if h else None)
            st.drained = covering(drained, sl.gpu_index)
            other = foreign.get(sl.pipe_directory or "") if sl.kind == "mps" and h is None else None
            down = self.host.mps.unavailable(sl)  # None for MIG slices, and while the daemon answers
            if down is not None:
                st.unavailable, st.why_not = True, down
            elif other is not None:
                st.why_not = (
                    f"another user holds an MPS slot on GPU {sl.gpu_index} (MPS serialises different users' "
                    f"clients): not yours until they check in, by {utc_text(other.session.expires_at)} at the latest"
                )
            if h is not None and (c.admin or h.session.uid == c.uid):
                st.holder, st.holder_uid, st.session_id = h.session.user, h.session.uid, h.session.id
            out.append(st.model_dump(mode="json"))
        return out

    def _admin(self, c: Caller, what: str) -> None:
        if not c.admin:
            ag = self.host.config.policy.admin_group
            raise RequestError("forbidden", "only root" + (f" or members of {ag}" if ag else "") + f" may {what}")

    def op_release(self, c: Caller, args: ReleaseArgs) -> Any:
        self._admin(c, "force-release a session")
        if not args.force:
            raise RequestError("usage", "release ends another user's session; pass --force")
        sid = args.id
        held = self.host.registry.get(sid)
        if held is None or held.session.ended_at is not None:
            raise RequestError("not_found", f"no live session {sid}")
        why = "released" + (f": {args.reason}" if args.reason else "")
        reason: EndReason = "layout" if args.reason == "layout" else "released"  # a MIG layout change ends it first
        ended = end_session(self.host, sid, reason, "release", c.uid, note=why)
        if ended is None:
            raise RequestError("not_found", f"session {sid} already ended")
        self.cleanup.after_end(ended)
        notify_terminals(ended.session.uid, f"an administrator ended session {sid} on {ended.slice.id} ({why})")
        return ended.session.model_dump(mode="json")

    def op_drain(self, c: Caller, args: DrainArgs) -> Any:
        """No new checkout on the GPU (or the host); with ``by``, its live sessions end that soon."""
        self._admin(c, "drain this host or its GPUs")
        if args.gpu is not None and self.host.reader is not None:
            have = sorted(g.index for g in self.host.reader.gpus())
            if args.gpu not in have:
                raise RequestError("usage", f"this host has no GPU {args.gpu}; its GPUs: {have}")
        within = parse_duration(args.by, what="by") if args.by is not None else None  # positive: DrainArgs
        reason = args.reason.strip()
        done = drains.drain(
            self.host.registry, args.gpu, reason=reason, by_user=c.user, by_uid=c.uid, now=time.time(), within=within
        )
        d = done.drain
        self.host.audit.event("drain", gpu=d.gpu, reason=reason, by_uid=c.uid, by_user=c.user, within=within)
        for h in done.sessions:
            if h.session.id not in done.shortened:
                continue
            was = utc_text(utc_moment(done.shortened[h.session.id]))
            self.host.audit.record("drain_deadline", h, by_uid=c.uid, reason=reason, was=was)
            notify_terminals(
                h.session.uid,
                f"{d.describe()}. Session {h.session.id} on {h.slice.id} now ends at "
                f"{utc_text(h.session.expires_at)} (was {was}): save your work",
            )
        self.host.timers_due.set()  # the moved deadlines: notices and ends on time
        self.host.changed()  # the broker lists this host now and routes around the drain
        answer = Drained(drain=d, sessions=[h.session for h in done.sessions], shortened=sorted(done.shortened))
        return answer.model_dump(mode="json")

    def op_undrain(self, c: Caller, args: UndrainArgs) -> Any:
        self._admin(c, "undrain this host or its GPUs")
        ended = drains.undrain(self.host.registry, args.gpu)
        for d in ended:
            self.host.audit.event("undrain", gpu=d.gpu, by_uid=c.uid, by_user=c.user, drained_by=d.by_user)
        self.host.changed()
        return [d.model_dump(mode="json") for d in ended]

    def op_drains(self, c: Caller, args: RequestArgs) -> Any:
        return [d.model_dump(mode="json") for d in drains.listed(self.host.registry)]

    def op_report(self, c: Caller, args: ReportArgs) -> Any:
        since_s = parse_duration(args.since, what="since")  # parses: checked by ReportArgs
        until = datetime.now(timezone.utc)
        since = utc_moment(until.timestamp() - since_s)
        report = usage_report(self.host.registry, since, until, None if c.admin else c.uid)
        return report.model_dump(mode="json")

    def op_ledger(self, c: Caller, args: LedgerArgs) -> Any:
        from calque.session.daemon.daemon_ledger import host_ledger, sees_all  # the price tables on first use

        until = time.time()
        since = until - parse_duration(args.since, what="since")  # parses: checked by LedgerArgs
        every = sees_all(self.host, c)
        return host_ledger(self.host, since, until, None if every else c.uid).model_dump(mode="json")

    def op_budget_override(self, c: Caller, args: BudgetOverrideArgs) -> Any:
        from calque.session.daemon.daemon_ledger import override

        return override(self.host, c, args.lab, args.extra, args.reason).model_dump(mode="json")

    def op_budget_elsewhere(self, c: Caller, args: BudgetElsewhereArgs) -> Any:
        from calque.session.daemon.daemon_ledger import elsewhere

        return elsewhere(self.host, c, args)

    def op_metrics(self, c: Caller, args: RequestArgs) -> Any:
        # prometheus_client only where metrics are read; holders by user for admins only
        from calque.session.daemon.daemon_metrics import collector_registry, render

        reg = self._metrics.get(c.admin)
        if reg is None:
            host = self.host
            idle = host.config.idle_policy
            reg = self._metrics[c.admin] = collector_registry(
                host.inventory,
                host.registry.live,
                host.tally,
                holders=c.admin,
                idle_for=idle.for_ if idle is not None else None,
                drains=lambda: drains.listed(host.registry),
            )
        return {"text": render(reg)}
