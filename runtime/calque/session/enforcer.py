"""Time limits the daemon enforces itself: a timer thread in the main process, which serves no client.

Before expiry the holder gets a notice (a line on their terminals, through their own descriptors, and
``notice_signal`` to their processes on the slice). At expiry their processes get SIGTERM (those on
the slice and those in the session's cgroup), then SIGKILL after ``kill_grace``, and the slice is
reclaimed. However a session ends, its cgroup is killed; processes outside it still holding one of
its nodes open are ended by the node guard on the next tick (``guard.py``). Reclaims run on a fixed
pool of threads started with the daemon (starting a thread can fail under load; queueing cannot),
and one that fails is retried on a later tick. With ``idle_expiry`` a session whose slice has had no
process for that long ends too. "On the slice" is what the GPU backend reports for the slice's
device, restricted to processes the holder owns.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from pathlib import Path

from calque.models import GpuProcess
from calque.session import isolation
from calque.session.cgroup import SessionCgroups
from calque.session.guard import NodeGuard
from calque.session.inventory import owner_of, pids_on, processes_on
from calque.session.notices import notify_terminals
from calque.session.registry import Held
from calque.session.service import Service

log = logging.getLogger("calque.session")

MAX_SLEEP_S = 0.25
CLEANUP_BATCH_S = 0.1
RECLAIMERS = 8
RETRY_AFTER_S = 1.0


def _alive(pid: int, uid: int) -> bool:
    if owner_of(pid) != uid:
        return False
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return "Z" not in line.split()[1]
    except OSError:
        return False
    return True


def _signal(pids: list[int], uid: int, sig: int) -> list[int]:
    sent = []
    for pid in pids:
        if owner_of(pid) != uid:  # never signal a pid that now belongs to someone else
            continue
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except ProcessLookupError:
            continue
        except PermissionError as exc:
            log.error("cannot signal pid %d: %s", pid, exc)
    return sent


class Enforcer:
    """One timer thread for notices, expiry and idle; one short-lived thread per reclaim."""

    def __init__(self, service: Service) -> None:
        self.svc = service
        self.cfg = service.config
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._reclaiming: set[str] = set()
        self._retry_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="session-timers", daemon=True)
        self.cgroups = SessionCgroups.from_config(self.cfg)
        self.guard = NodeGuard(service)
        self._reclaims: queue.Queue[tuple[Held, str, str] | None] = queue.Queue()
        self._reclaimers = [
            threading.Thread(target=self._reclaim_loop, name=f"session-reclaim-{i}", daemon=True)
            for i in range(RECLAIMERS)
        ]
        self._cleanup: queue.Queue[Held | None] = queue.Queue()
        self._cleaner = threading.Thread(target=self._cleanup_loop, name="session-cleanup", daemon=True)
        self._last_reassert = 0.0
        try:
            self._notice_sig = int(getattr(signal, self.cfg.notice_signal))
        except (AttributeError, TypeError):
            self._notice_sig = int(signal.SIGUSR1)

    def start(self) -> None:
        self.guard.start()
        for t in self._reclaimers:
            t.start()
        self._thread.start()
        self._cleaner.start()

    def start_cleanup(self) -> None:
        """Only the check-in cleanup (worker processes; the timers run in the main process)."""
        self._cleaner.start()

    def stop(self) -> None:
        self._cleanup.put(None)
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
        live = self.svc.registry.live()
        self.sweep_cgroups(with_cgroup, {h.session.id for h in live})
        reassert = now - self._last_reassert >= self.cfg.reassert_every
        procs: list[GpuProcess] | None = None
        for h in live:
            sid = h.session.id
            if h.expires <= now:
                self._start_reclaim(h, "expired", "expiry")
                continue
            notice_at = h.expires - self.cfg.notice_before
            if not h.session.notice_sent:
                if notice_at <= now:
                    self._notice(h, now)
                else:
                    next_due = min(next_due, notice_at)
            next_due = min(next_due, h.expires)
            if self.cfg.idle_expiry is not None:
                if procs is None:  # one listing from the GPU backend per tick, not one per session
                    procs = self.svc.reader.processes() if self.svc.reader is not None else []
                pids = pids_on(procs, h.slice, h.session.uid)
                if any(_alive(p, h.session.uid) for p in pids):
                    if now - h.last_active > 1.0:
                        self.svc.registry.touch(sid, now)
                elif now - h.last_active >= self.cfg.idle_expiry:
                    self._start_reclaim(h, "idle", "idle")
        if reassert:
            self.svc.reassert_nodes()
            self.guard.secure_pipes(live)
            self._last_reassert = now
        self.guard.check(live, everything=reassert)
        return next_due - time.time()

    def _notice(self, h: Held, now: float) -> None:
        left = max(0, int(h.expires - now))
        msg = (
            f"session {h.session.id} on {h.slice.id} ends in {left} s; "
            f"`calque session extend {h.session.id} --by 30m` or save your work"
        )
        pids = processes_on(self.svc.reader, h.slice, h.session.uid)
        signalled = _signal(pids, h.session.uid, self._notice_sig)
        ttys = notify_terminals(h.session.uid, msg)
        self.svc.registry.mark_notice(h.session.id)
        self.svc.audit.record("notice", h, by_uid=0, reason=f"{left} s left", pids=signalled, terminals=ttys)

    def _start_reclaim(self, h: Held, reason: str, event: str) -> None:
        with self._lock:
            if h.session.id in self._reclaiming or time.monotonic() < self._retry_at.get(h.session.id, 0.0):
                return
            self._reclaiming.add(h.session.id)
        self._reclaims.put((h, reason, event))

    def _reclaim_loop(self) -> None:
        while True:
            item = self._reclaims.get()
            if item is None:
                return
            self._expire(*item)

    def _expire(self, h: Held, reason: str, event: str) -> None:
        sid = h.session.id
        failed = False
        try:
            self.cgroups.signal(sid, signal.SIGTERM)
            self.terminate(h)
            ended = self.svc.end(h.session.id, reason, event, 0)
            self.finish(ended or h)
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

    def finish(self, *ended: Held) -> None:
        """After the end: the sessions' cgroups and MPS pipe directories (whoever else holds their nodes
        open is ended by the guard's next tick in the main process)."""
        # Most sessions never started work in a cgroup: one listing instead of a look per session.
        present = set(self.cgroups.sessions()) if len(ended) > 1 else None
        for h in ended:
            if present is None or h.session.id in present:
                self.cgroups.kill(h.session.id)
        pipes = {h.slice.pipe_directory for h in ended if h.slice.kind == "mps" and h.slice.pipe_directory}
        if pipes:
            live = self.svc.registry.live()
            for pipe in sorted(pipes):
                isolation.set_pipe_holders(pipe, {x.session.uid for x in live if x.slice.pipe_directory == pipe})

    def sweep_cgroups(self, with_cgroup: list[str], live: set[str]) -> None:
        """Kill the cgroup of any session that is no longer live (ended by another process, or before
        a restart). ``with_cgroup`` was listed before ``live`` was read, so a cgroup made for a new
        session after that read is not in it."""
        for sid in with_cgroup:
            if sid not in live:
                log.info("session %s has ended: killing its cgroup", sid)
                self.cgroups.kill(sid)

    def reclaim_after_end(self, h: Held) -> None:
        """After a check-in or release: stop what the holder left running on the slice (off the request path)."""
        self._cleanup.put(h)

    def _cleanup_loop(self) -> None:
        # Batched: one process listing from the GPU backend for every check-in of the last moment.
        while True:
            first = self._cleanup.get()
            if first is None:
                return
            time.sleep(CLEANUP_BATCH_S)
            batch = [first]
            stop = False
            while True:
                try:
                    item = self._cleanup.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            try:
                procs = self.svc.reader.processes() if self.svc.reader is not None else []
                self.finish(*batch)  # cgroups and node holders first: at once, no grace after a check-in
                for h in batch:
                    if any(_alive(p, h.session.uid) for p in pids_on(procs, h.slice, h.session.uid)):
                        self.terminate(h)
            except Exception:
                log.exception("cleaning up after %s failed", ", ".join(h.session.id for h in batch))
            if stop:
                return

    def terminate(self, h: Held) -> list[int]:
        """SIGTERM the holder's processes on the slice, SIGKILL after the grace; returns the pids hit."""
        uid = h.session.uid
        hit: set[int] = set()
        deadline = time.monotonic() + self.cfg.kill_grace
        while True:
            pids = [p for p in processes_on(self.svc.reader, h.slice, uid) if _alive(p, uid)]
            fresh = [p for p in pids if p not in hit]
            hit.update(_signal(fresh, uid, signal.SIGTERM))
            alive = [p for p in hit if _alive(p, uid)]
            if not alive and not fresh:
                return sorted(hit)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        _signal([p for p in hit if _alive(p, uid)], uid, signal.SIGKILL)
        end = time.monotonic() + 2.0
        while time.monotonic() < end and any(_alive(p, uid) for p in hit):
            time.sleep(0.02)
        return sorted(hit)
