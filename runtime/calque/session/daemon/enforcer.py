"""Time limits the daemon enforces itself: a timer thread in the main process, which serves no client.

Before expiry the holder gets a notice (a line on their terminals, through their own descriptors, and
``notice_signal`` to their processes on the slice). At expiry their processes get SIGTERM (those on
the slice and those in the session's cgroup), then SIGKILL after ``kill_grace``, and the slice is
reclaimed. A live MPS session's holder is told when its control daemon stops answering, and when it
answers again (``mpsdaemons.py``), on every ``reassert_every``. However a session ends, its cgroup is
killed; processes outside it still holding one of its nodes open are ended by the node guard on the
next tick (``guard.py``). Reclaims run on a fixed
pool of threads started with the daemon (starting a thread can fail under load; queueing cannot),
and one that fails is retried on a later tick. With ``idle`` (or the older ``idle_expiry``) a session
whose slice stays idle that long ends too, reason ``idle`` (``idle.py`` judges it, and sends the
checkpoint signal before; the end's audit line says what was read and when both signals went); one that reaches the
deadline a drain set (``drains.py``) ends the same way, reason ``drained``. "On the slice" is
what the GPU backend reports for the slice's device, restricted to processes the holder owns.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from typing import Any

from calque.session.daemon.cleanup import Cleanup, signal_pids
from calque.session.daemon.drains import drain_covering
from calque.session.daemon.escapes import ScopeWatch
from calque.session.daemon.guard import NodeGuard
from calque.session.daemon.host import Host
from calque.session.daemon.idle import idle_watch
from calque.session.daemon.inventory import processes_on
from calque.session.daemon.mpsdaemons import MpsWatch
from calque.session.daemon.nodes import end_session, reassert_nodes
from calque.session.daemon.notices import notify_server_logs, notify_terminals
from calque.session.daemon.rows import Held
from calque.timefmt import utc_moment

log = logging.getLogger("calque.session")

MAX_SLEEP_S = 0.25
RECLAIMERS = 8
RETRY_AFTER_S = 1.0


def iso(epoch: float) -> str:
    return utc_moment(epoch).isoformat()


class Enforcer:
    """One timer thread for notices, expiry and idle; one short-lived thread per reclaim."""

    def __init__(self, host: Host, cleanup: Cleanup, guard: NodeGuard) -> None:
        self.host = host
        self.cfg = host.config
        self.cleanup = cleanup
        self.cgroups = host.cgroups
        self.guard = guard
        self.scopes = ScopeWatch(host.cgroups)
        self.mps = MpsWatch(host.mps, host.audit)
        self._wake = host.timers_due
        self._stop = threading.Event()
        self._reclaiming: set[str] = set()
        self._retry_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="session-timers", daemon=True)
        self._reclaims: queue.Queue[tuple[Held, str, str, dict[str, Any]] | None] = queue.Queue()
        self._reclaimers = [
            threading.Thread(target=self._reclaim_loop, name=f"session-reclaim-{i}", daemon=True)
            for i in range(RECLAIMERS)
        ]
        self._last_reassert = 0.0
        self._foreign: set[str] = set()  # session cgroups under our parent that this registry never had
        self.idle = idle_watch(host)
        try:
            self._notice_sig = int(getattr(signal, self.cfg.notice_signal))
        except (AttributeError, TypeError):
            self._notice_sig = int(signal.SIGUSR1)

    def start(self) -> None:
        self.guard.start()
        for t in self._reclaimers:
            t.start()
        self._thread.start()
        self.cleanup.start()

    def stop(self) -> None:
        self.cleanup.stop()
        self.guard.stop()
        for _ in self._reclaimers:
            self._reclaims.put(None)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                delay = self.tick(time.time())
            except Exception:
                log.exception("session timer tick failed; retrying")
                delay = 1.0
            self._wake.wait(max(0.0, min(delay, MAX_SLEEP_S)))
            self._wake.clear()

    def tick(self, now: float) -> float:
        """Act on every live session; returns seconds until the next thing is due."""
        next_due = now + MAX_SLEEP_S
        with_cgroup = self.cgroups.sessions()  # before reading the registry: see sweep_cgroups
        live = self.host.registry.live()
        self.sweep_cgroups(with_cgroup, {h.session.id for h in live})
        for sid, pids in self.scopes.tick(live, with_cgroup).items():
            held = next((h for h in live if h.session.id == sid), None)
            if held is not None:
                self.host.audit.record("left_scope", held, by_uid=0, reason="left the session's cgroup", pids=pids)
        reassert = now - self._last_reassert >= self.cfg.reassert_every
        for h in live:
            sid = h.session.id
            if h.expires <= now:
                if self._at_drain_deadline(h):
                    self._start_reclaim(h, "drained", "drained")
                else:
                    self._start_reclaim(h, "expired", "expiry")
                continue
            marks = self._notice_marks
            if h.notices < len(marks):
                notice_at = h.expires - marks[h.notices]
                if notice_at <= now:
                    # Every mark already passed counts as sent: one notice, not two in a row.
                    self._notice(h, now, sent=sum(1 for m in marks if h.expires - m <= now), first=h.notices == 0)
                else:
                    next_due = min(next_due, notice_at)
            next_due = min(next_due, h.expires)
        if self.idle is not None:  # idle reclaim (idle.py): the same reclaim as an expiry, reason idle
            try:
                ending, idle_due = self.idle.tick([h for h in live if h.expires > now], now)
            except Exception:  # the nodes' re-check and the guard below still run
                log.exception("idle reclaim tick failed; retrying")
                ending, idle_due = [], now + 1.0
            for h in ending:  # the audit line says what was read and when the checkpoint signal went
                cp = self.idle.checkpoint_at(h.session.id)
                read = {"read": self.idle.why(h.session.id), "checkpoint_at": None if cp is None else iso(cp)}
                self._start_reclaim(h, "idle", "idle", read)
            next_due = min(next_due, idle_due)
        if reassert:
            reassert_nodes(self.host)
            self.guard.secure_pipes(live)
            self.mps.tick(live)  # holders told when their MPS daemon stops (or starts again) answering
            self._last_reassert = now
        self.guard.check(live, everything=reassert)
        return next_due - time.time()

    def _at_drain_deadline(self, h: Held) -> bool:
        """The session ends at the deadline a drain of its GPU (or the host) set (``drains.py``)."""
        d = drain_covering(self.host.registry, h.slice.gpu_index)
        return d is not None and d.deadline is not None and h.expires >= d.deadline.timestamp() - 1.0

    @property
    def _notice_marks(self) -> list[float]:
        """Seconds before the end a notice goes out: ``notice_before``, then ``final_notice_before``."""
        final = self.cfg.final_notice_before
        return [self.cfg.notice_before] + ([final] if final is not None and final < self.cfg.notice_before else [])

    def _notice(self, h: Held, now: float, sent: int = 1, first: bool = True) -> None:
        left = max(0, int(h.expires - now))
        msg = (
            f"session {h.session.id} on {h.slice.id} ends in {left} s; "
            f"`calque session extend {h.session.id} --by 30m` or save your work"
        )
        if self._at_drain_deadline(h):  # no extension passes a drain's deadline: say so, not "extend"
            msg = f"session {h.session.id} on {h.slice.id} ends in {left} s (drained); save your work"
        # The signal goes with the first notice only: a workload's handler runs once per deadline.
        pids = processes_on(self.host.reader, h.slice, h.session.uid) if first else []
        signalled = signal_pids(pids, h.session.uid, self._notice_sig) if first else []
        ttys = notify_terminals(h.session.uid, msg)
        logs = notify_server_logs(self.host.cgroups.pids(h.session.id), h.session.uid, h.session.id, msg)
        self.host.registry.mark_notice(h.session.id, sent)
        self.host.audit.record(
            "notice", h, by_uid=0, reason=f"{left} s left", pids=signalled, terminals=ttys, server_logs=logs
        )

    def _start_reclaim(self, h: Held, reason: str, event: str, audit: dict[str, Any] | None = None) -> None:
        with self._lock:
            if h.session.id in self._reclaiming or time.monotonic() < self._retry_at.get(h.session.id, 0.0):
                return
            self._reclaiming.add(h.session.id)
        self._reclaims.put((h, reason, event, audit or {}))

    def _reclaim_loop(self) -> None:
        while True:
            item = self._reclaims.get()
            if item is None:
                return
            self._expire(*item)

    def _expire(self, h: Held, reason: str, event: str, audit: dict[str, Any]) -> None:
        sid = h.session.id
        failed = False
        try:
            sigterm_at = time.time()
            hit = self.cleanup.terminate(h)  # the slice's processes and the cgroup's: SIGTERM, the grace, SIGKILL
            # The end's audit line says when SIGTERM went and to whom (after a checkpoint signal, that lead).
            audit = {**audit, "sigterm_at": iso(sigterm_at), "terminated": hit}
            ended = end_session(self.host, h.session.id, reason, event, 0, **audit)  # type: ignore[arg-type]
            self.cleanup.finish(ended or h)
        except Exception:
            failed = True
            log.exception("reclaiming %s failed; retrying in %g s", sid, RETRY_AFTER_S)
        finally:
            with self._lock:
                self._reclaiming.discard(sid)
                if failed:
                    self._retry_at[sid] = time.monotonic() + RETRY_AFTER_S
                else:
                    self._retry_at.pop(sid, None)

    def sweep_cgroups(self, with_cgroup: list[str], live: set[str]) -> None:
        """Kill the cgroup of any session of ours that is no longer live (ended by another process, or
        before a restart). ``with_cgroup`` was listed before ``live`` was read, so a cgroup made for a
        new session after that read is not in it. A cgroup of a session this registry never had is not
        ours (another daemon's under the same parent: a second service on the host, a test's daemons
        side by side): it is named once and left alone, never killed."""
        for sid in with_cgroup:
            if sid in live or sid in self._foreign:
                continue
            if self.host.registry.get(sid) is None:
                self._foreign.add(sid)
                log.warning("cgroup of session %s is not one of this daemon's sessions; leaving it", sid)
                continue
            log.info("session %s has ended: killing its cgroup", sid)
            self.cgroups.kill(sid)
        self._foreign.intersection_update(with_cgroup)  # forget the foreign cgroups that are gone
