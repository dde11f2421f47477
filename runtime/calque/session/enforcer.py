"""Time limits the daemon enforces itself: a timer thread, not a sweep on the next request.

Before expiry the holder gets a notice (a line on their terminals and ``notice_signal`` to their
processes on the slice). At expiry their processes on the slice get SIGTERM, then SIGKILL after
``kill_grace``, and the slice is reclaimed as soon as they are gone. With ``idle_expiry`` a session
whose slice has had no process for that long ends too. "On the slice" is what the GPU backend reports
for the slice's device, restricted to processes the holder owns (never anyone else's).
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
from calque.session.inventory import owner_of, pids_on, processes_on
from calque.session.registry import Held
from calque.session.service import Service

log = logging.getLogger("calque.session")

MAX_SLEEP_S = 0.25
CLEANUP_BATCH_S = 0.1


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


def notify_terminals(uid: int, message: str) -> int:
    """Write ``message`` to every terminal the user has a process on; returns how many."""
    ttys: set[str] = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or owner_of(int(d.name)) != uid:
            continue
        for fd in ("0", "1", "2"):
            try:
                target = os.readlink(d / "fd" / fd)
            except OSError:
                continue
            if target.startswith(("/dev/pts/", "/dev/tty")):
                ttys.add(target)
    n = 0
    for tty in sorted(ttys):
        try:
            tfd = os.open(tty, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            os.write(tfd, f"\r\n[calque session] {message}\r\n".encode())
            n += 1
        except OSError:
            pass
        finally:
            os.close(tfd)
    return n


class Enforcer:
    """One timer thread for notices, expiry and idle; one short-lived thread per reclaim."""

    def __init__(self, service: Service) -> None:
        self.svc = service
        self.cfg = service.config
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._reclaiming: set[str] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="session-timers", daemon=True)
        self._cleanup: queue.Queue[Held | None] = queue.Queue()
        self._cleaner = threading.Thread(target=self._cleanup_loop, name="session-cleanup", daemon=True)
        self._last_reassert = 0.0
        try:
            self._notice_sig = int(getattr(signal, self.cfg.notice_signal))
        except (AttributeError, TypeError):
            self._notice_sig = int(signal.SIGUSR1)

    def start(self) -> None:
        self._thread.start()
        self._cleaner.start()

    def start_cleanup(self) -> None:
        """Only the check-in cleanup (worker processes; the timers run in the main process)."""
        self._cleaner.start()

    def stop(self) -> None:
        self._cleanup.put(None)
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
        live = self.svc.registry.live()
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
            self._last_reassert = now
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
            if h.session.id in self._reclaiming:
                return
            self._reclaiming.add(h.session.id)
        threading.Thread(
            target=self._expire, args=(h, reason, event), name=f"reclaim-{h.session.id}", daemon=True
        ).start()

    def _expire(self, h: Held, reason: str, event: str) -> None:
        try:
            self.terminate(h)
            self.svc.end(h, reason, event, 0)
        except Exception:
            log.exception("reclaiming %s failed", h.session.id)
        finally:
            with self._lock:
                self._reclaiming.discard(h.session.id)

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
