"""Idle reclaim (``idle`` in session.yaml), judged where expiry is: the daemon's timer thread.

Each live session's idle clock is its registry row's ``last_active``: a checkout starts it, a slice
seen active moves it to now, and nothing a client sends does (``extend`` moves the deadline, not the
clock), so no holder can hold an idle slice by talking to the daemon. A slice is active when a live
process of its holder runs on it and the driver's activity for it is at or above ``below``, or unknown
(never reclaim on a guess); no such process is idle. For an MPS slot the activity is its holder's
clients' own (per-process samples) where the driver gives them, else the whole GPU's, which counts
other users' work too and so can only keep a slot, never end it early. Members of ``exempt_groups``
are never reclaimed. At ``for - warn`` of idleness the holder's terminals get a notice; at ``for`` the
session ends with reason ``idle`` in the audit trail and the usage row, as an expiry does. The clock
and the notice are in the registry, so a daemon restart keeps both.
"""

from __future__ import annotations

import logging
from datetime import datetime

from calque.durations import format_duration
from calque.gpu.backend import GpuReader
from calque.models import DeviceSample, GpuProcess
from calque.session.config import IdlePolicy
from calque.session.daemon.cleanup import alive
from calque.session.daemon.host import Host
from calque.session.daemon.identity import Identities
from calque.session.daemon.inventory import pids_on
from calque.session.daemon.notices import notify_terminals
from calque.session.daemon.rows import Held, ts

log = logging.getLogger("calque.session")

SAMPLE_EVERY_S = 1.0  # one reading of the driver per second for every session, not one per session
TOUCH_EVERY_S = 10.0  # an active slice's clock is written at most this often (or for/10 when shorter)


def slice_activity(h: Held, pids: list[int], samples: list[DeviceSample]) -> float | None:
    """The slice's activity in percent from ``samples``; None when the driver reported none."""
    sl = h.slice
    if sl.kind == "mig":
        got = [s.active_percent for s in samples if s.kind == "mig" and s.device_uuid == sl.mig_uuid]
        return got[0] if got else None
    own = [
        pct
        for s in samples
        if s.kind == "process" and s.device_uuid == sl.gpu_uuid and s.pid in pids
        if (pct := s.active_percent) is not None
    ]
    if own:
        return max(own)
    whole = [s.active_percent for s in samples if s.kind == "gpu" and s.device_uuid == sl.gpu_uuid]
    return whole[0] if whole else None


def is_active(h: Held, pids: list[int], samples: list[DeviceSample], below: float) -> bool:
    """No process of the holder: idle. Otherwise active unless the driver measured less than ``below``."""
    if not pids:
        return False
    pct = slice_activity(h, pids, samples)
    return pct is None or pct >= below


def idle_clock(policy: IdlePolicy | None, h: Held, exempt: bool) -> tuple[datetime | None, datetime | None]:
    """(last seen active, ends if it stays idle) for ``calque session status``; (None, None) when off."""
    if policy is None or exempt:
        return None, None
    return ts(h.last_active), ts(h.last_active + policy.for_)


class IdleWatch:
    """Decides, per tick, which sessions' clocks move, which get the notice, and which end."""

    def __init__(self, host: Host, policy: IdlePolicy) -> None:
        self.host = host
        self.policy = policy
        self.identities = Identities(host.config)
        self._sampled_at = 0.0
        self._active: dict[str, bool] = {}
        self._failing = False

    def exempt(self, h: Held) -> bool:
        groups = self.identities.caller(0, h.session.uid, h.session.gid).groups
        return bool(groups & set(self.policy.exempt_groups))

    def _sample(self, live: list[Held]) -> None:
        reader: GpuReader | None = self.host.reader
        try:
            procs: list[GpuProcess] = reader.processes() if reader is not None else []
            samples: list[DeviceSample] = reader.utilisation() if reader is not None else []
        except Exception as exc:  # a driver that cannot answer reclaims nothing: every slice is unknown
            if not self._failing:
                log.warning("cannot read GPU utilisation (%s): no session is reclaimed as idle until it can", exc)
            self._failing = True
            self._active = {h.session.id: True for h in live}
            return
        self._failing = False
        active = {}
        for h in live:
            uid = h.session.uid
            pids = [p for p in pids_on(procs, h.slice, uid) if alive(p, uid)]
            active[h.session.id] = is_active(h, pids, samples, self.policy.below)
        self._active = active

    def tick(self, live: list[Held], now: float) -> tuple[list[Held], float]:
        """The sessions idle for ``for`` (to end now) and when the next idle step is due."""
        if now - self._sampled_at >= SAMPLE_EVERY_S:
            self._sample(live)
            self._sampled_at = now
        p = self.policy
        ending: list[Held] = []
        touched: list[str] = []
        # A stale clock can only end a session early by this much, so it is small beside ``for``.
        touch_every = min(TOUCH_EVERY_S, p.for_ / 10)
        next_due = now + SAMPLE_EVERY_S
        for h in live:
            sid = h.session.id
            active = self._active.get(sid)
            if active is None:
                continue  # not measured yet: checked out since the last sample
            if active:
                if now - h.last_active >= touch_every:
                    touched.append(sid)
                continue
            if self.exempt(h):
                continue  # measured (its clock is kept, for the metrics), never reclaimed
            idle_for = now - h.last_active
            if idle_for >= p.for_:
                ending.append(h)
                continue
            warn_at = h.last_active + p.for_ - p.warn
            if p.warn > 0 and not h.idle_notice:
                if now >= warn_at:
                    self._notice(h, now)
                else:
                    next_due = min(next_due, warn_at)
            next_due = min(next_due, h.last_active + p.for_)
        self.host.registry.touch(touched, now)  # one transaction for every active slice
        return ending, next_due

    def _notice(self, h: Held, now: float) -> None:
        left = max(0.0, h.last_active + self.policy.for_ - now)
        msg = (
            f"session {h.session.id} on {h.slice.id} has been idle (below {self.policy.below:g}% or no process) "
            f"for {format_duration(now - h.last_active)}; it ends in {format_duration(left)} unless its slice "
            "gets busy (`calque session extend` does not reset the idle clock)"
        )
        ttys = notify_terminals(h.session.uid, msg)
        self.host.registry.mark_idle_notice(h.session.id)
        self.host.audit.record("idle_notice", h, by_uid=0, reason=f"{left:.0f} s left unless active", terminals=ttys)


def idle_watch(host: Host) -> IdleWatch | None:
    policy = host.config.idle_policy
    return IdleWatch(host, policy) if policy is not None else None
