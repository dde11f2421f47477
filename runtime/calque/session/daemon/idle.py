"""Idle reclaim (``idle`` in session.yaml), judged where expiry is: the daemon's timer thread.

Each live session's idle clock is its registry row's ``last_active``: a checkout starts it, a slice
seen active moves it to now, and nothing a client sends does (``extend`` moves the deadline, not the
clock), so no holder can hold an idle slice by talking to the daemon. Whether a slice is active is
``activity.py``'s rule, on every reading of the driver (engines, memory, anyone's processes; unknown is
active); a driver that cannot answer at all keeps every slice. Members of ``exempt_groups`` are never
reclaimed. At ``for - warn`` of idleness the holder's terminals get a notice (and, with ``mail`` in
session.yaml, her mailbox: ``idlemail.py``); with ``checkpoint_signal``, at ``for - checkpoint_before``
the session's processes (the holder's on the slice and in the session's cgroup) get that signal and
the terminals a line, and the end waits until ``checkpoint_before`` after the signal went, whenever
that was; at ``for`` the session ends with reason ``idle`` in the audit trail and the usage row, as an
expiry does. The clock and the notice are in the registry, so a daemon restart keeps both; but what
the slice did while the daemon was down is unknown, and unknown is active: every session live at the
start has its clock start again there, so it gets a whole idle period, a fresh notice and a fresh
checkpoint signal before any reclaim.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import replace
from datetime import datetime

from calque.durations import format_duration
from calque.gpu.backend import GpuReader
from calque.models import DeviceSample, GpuProcess
from calque.session.daemon.activity import Reading, slice_reading
from calque.session.daemon.cleanup import alive, signal_pids
from calque.session.daemon.host import Host
from calque.session.daemon.identity import Identities
from calque.session.daemon.idlemail import IdleMail
from calque.session.daemon.inventory import pids_on
from calque.session.daemon.notices import notify_server_logs, notify_terminals
from calque.session.daemon.rows import Held
from calque.session.session_config import IdlePolicy
from calque.timefmt import utc_moment

log = logging.getLogger("calque.session")

SAMPLE_EVERY_S = 1.0  # one reading of the driver per second for every session, not one per session
TOUCH_EVERY_S = 10.0  # an active slice's clock is written at most this often (or for/10 when shorter)


def idle_clock(policy: IdlePolicy | None, h: Held, exempt: bool) -> tuple[datetime | None, datetime | None]:
    """(last seen active, ends if it stays idle) for ``calque session status``; (None, None) when off."""
    if policy is None or exempt:
        return None, None
    return utc_moment(h.last_active), utc_moment(h.last_active + policy.for_)


class IdleWatch:
    """Decides, per tick, which sessions' clocks move, which get the notice and the checkpoint signal,
    and which end."""

    def __init__(self, host: Host, policy: IdlePolicy) -> None:
        self.host = host
        self.policy = policy
        self.identities = Identities(host.config)
        mail = host.config.mail
        self.mail = IdleMail(mail, host.audit, host.config.host_name) if mail is not None else None
        self._started = time.time()  # sessions idle since before this: the daemon was down, use unknown
        self._resumed = False
        self._sampled_at = 0.0
        self._readings: dict[str, Reading] = {}
        self._procs: list[GpuProcess] = []
        self._checkpoints: dict[str, tuple[float, float]] = {}  # session -> (idle clock it was for, sent at)
        self._failing = False
        sig = policy.checkpoint_signal
        self._checkpoint_sig = int(getattr(signal, sig)) if sig is not None else None

    def exempt(self, h: Held) -> bool:
        groups = self.identities.caller(0, h.session.uid, h.session.gid).groups
        return bool(groups & set(self.policy.exempt_groups))

    def why(self, sid: str) -> str:
        """What the last reading of the session's slice said (the idle end's audit line carries it)."""
        got = self._readings.get(sid)
        return got.why if got is not None else "not read"

    def checkpoint_at(self, sid: str) -> float | None:
        got = self._checkpoints.get(sid)
        return got[1] if got is not None else None

    def _sample(self, live: list[Held]) -> None:
        reader: GpuReader | None = self.host.reader
        try:
            procs: list[GpuProcess] = reader.processes() if reader is not None else []
            samples: list[DeviceSample] = reader.utilisation() if reader is not None else []
        except Exception as exc:  # a driver that cannot answer reclaims nothing: every slice is unknown
            if not self._failing:
                log.warning("cannot read GPU utilisation (%s): no session is reclaimed as idle until it can", exc)
            self._failing = True
            self._readings = {h.session.id: Reading(True, f"the driver did not answer: {exc}") for h in live}
            return
        self._failing = False
        self._procs = procs
        readings = {}
        for h in live:
            uid = h.session.uid
            # An MPS slot is its holder's clients (owner_of reads /proc: only where it is needed).
            clients = [p for p in pids_on(procs, h.slice, uid) if alive(p, uid)] if h.slice.kind == "mps" else []
            readings[h.session.id] = slice_reading(h, clients, procs, samples, self.policy)
        self._readings = readings

    def _resume(self, live: list[Held]) -> list[Held]:
        """Once, at the daemon's start: a clock older than the start starts again there."""
        self._resumed = True
        behind = [h for h in live if h.last_active < self._started]
        if not behind:
            return live
        self.host.registry.touch([h.session.id for h in behind], self._started)
        log.info(
            "%d session(s) were held while the daemon was down: their idle clocks start again at its start", len(behind)
        )
        late = {h.session.id for h in behind}
        return [replace(h, last_active=self._started, idle_notice=False) if h.session.id in late else h for h in live]

    def tick(self, live: list[Held], now: float) -> tuple[list[Held], float]:
        """The sessions idle for ``for`` (to end now) and when the next idle step is due."""
        if not self._resumed:
            live = self._resume(live)
        if now - self._sampled_at >= SAMPLE_EVERY_S:
            self._sample(live)
            self._sampled_at = now
        p = self.policy
        ending: list[Held] = []
        touched: list[str] = []
        # A stale clock can only end a session early by this much, so it is small beside ``for``.
        touch_every = min(TOUCH_EVERY_S, p.for_ / 10)
        next_due = now + SAMPLE_EVERY_S
        held = {h.session.id for h in live}
        self._checkpoints = {sid: c for sid, c in self._checkpoints.items() if sid in held}
        for h in live:
            sid = h.session.id
            reading = self._readings.get(sid)
            if reading is None:
                continue  # not measured yet: checked out since the last sample
            if reading.active:
                self._checkpoints.pop(sid, None)  # a new idle spell gets a signal of its own
                if now - h.last_active >= touch_every:
                    touched.append(sid)
                continue
            if self.exempt(h):
                continue  # measured (its clock is kept, for the metrics), never reclaimed
            warn_at = h.last_active + p.for_ - p.warn
            if p.warn > 0 and not h.idle_notice:
                if now >= warn_at:
                    self._notice(h, now)
                else:
                    next_due = min(next_due, warn_at)
            end_at = self._end_at(h, now)
            if end_at is not None and now >= end_at:
                ending.append(h)
                continue
            next_due = min(next_due, end_at if end_at is not None else h.last_active + p.for_ - p.checkpoint_before)
        self.host.registry.touch(touched, now)  # one transaction for every active slice
        return ending, next_due

    def _end_at(self, h: Held, now: float) -> float | None:
        """When the idle session ends: ``for`` after its clock, and never sooner than
        ``checkpoint_before`` after its checkpoint signal, which goes first (sent now when due); None
        while the signal is not due yet."""
        p = self.policy
        end_at = h.last_active + p.for_
        if self._checkpoint_sig is None:
            return end_at
        sid = h.session.id
        sent = self._checkpoints.get(sid)
        if sent is None or sent[0] != h.last_active:
            if now < end_at - p.checkpoint_before:
                return None
            self._checkpoint(h, now)
            sent = self._checkpoints[sid] = (h.last_active, now)
        return max(end_at, sent[1] + p.checkpoint_before)

    def _checkpoint(self, h: Held, now: float) -> None:
        """The checkpoint signal to the session's processes (the holder's alone), a line on her terminals."""
        assert self._checkpoint_sig is not None and self.policy.checkpoint_signal is not None
        uid, sid = h.session.uid, h.session.id
        listed = pids_on(self._procs, h.slice, uid) + self.host.cgroups.pids(sid)
        pids = [pid for pid in dict.fromkeys(listed) if alive(pid, uid)]
        signalled = signal_pids(pids, uid, self._checkpoint_sig)
        before = self.policy.checkpoint_before
        name = self.policy.checkpoint_signal
        left = max(before, h.last_active + self.policy.for_ - now)
        msg = (
            f"session {sid} on {h.slice.id} is idle and ends in {format_duration(left)} unless its slice gets "
            f"busy: its processes got {name} to save their work before SIGTERM"
        )
        ttys = notify_terminals(uid, msg)
        self.host.audit.record(
            "idle_checkpoint", h, by_uid=0, reason=f"{name} {before:g} s before SIGTERM", signal=name, pids=signalled,
            terminals=ttys, read=self.why(sid),
        )  # fmt: skip

    def _notice(self, h: Held, now: float) -> None:
        left = max(0.0, h.last_active + self.policy.for_ - now)
        msg = (
            f"session {h.session.id} on {h.slice.id} has been idle ({self.why(h.session.id)}) "
            f"for {format_duration(now - h.last_active)}; it ends in {format_duration(left)} unless its slice "
            "gets busy (`calque session extend` does not reset the idle clock)"
        )
        ttys = notify_terminals(h.session.uid, msg)
        notify_server_logs(self.host.cgroups.pids(h.session.id), h.session.uid, h.session.id, msg)
        self.host.registry.mark_idle_notice(h.session.id)
        self.host.audit.record("idle_notice", h, by_uid=0, reason=f"{left:.0f} s left unless active", terminals=ttys)
        if self.mail is not None:  # after the notice is marked: a mail that fails is never sent twice
            ends_at = h.last_active + self.policy.for_
            try:
                self.mail.warn(
                    h, now - h.last_active, ends_at, now, self.why(h.session.id), self.policy.checkpoint_signal
                )
            except Exception:  # no thread to spare, the audit's disk: the reclaim goes on, unmailed
                log.exception("the idle warning for %s was not mailed", h.session.id)


def idle_watch(host: Host) -> IdleWatch | None:
    policy = host.config.idle_policy
    return IdleWatch(host, policy) if policy is not None else None
