"""After a session ends: its cgroup killed, its MPS pipe directory's holders set again, and what its
holder left running on the slice stopped (SIGTERM, SIGKILL after ``kill_grace``; at expiry the
session's cgroup too, before it is killed).

Every process that ends sessions has one: a worker process for check-ins and releases (batched, off
the request path), the main process for expiry. "On the slice" is what the GPU backend reports for
the slice's device, restricted to processes the holder owns.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from pathlib import Path

from calque.session.daemon import isolation
from calque.session.daemon.host import Host
from calque.session.daemon.inventory import owner_of, pids_on, processes_on
from calque.session.daemon.rows import Held

log = logging.getLogger("calque.session")

CLEANUP_BATCH_S = 0.1


def alive(pid: int, uid: int) -> bool:
    if owner_of(pid) != uid:
        return False
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return "Z" not in line.split()[1]
    except OSError:
        return False
    return True


def signal_pids(pids: list[int], uid: int, sig: int) -> list[int]:
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


class Cleanup:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.cgroups = host.cgroups
        self._queue: queue.Queue[Held | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="session-cleanup", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)

    def after_end(self, h: Held) -> None:
        """After a check-in or release: stop what the holder left running (off the request path)."""
        self._queue.put(h)

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
            live = self.host.registry.live()
            for pipe in sorted(pipes):
                isolation.set_pipe_holders(pipe, {x.session.uid for x in live if x.slice.pipe_directory == pipe})

    def _loop(self) -> None:
        # Batched: one process listing from the GPU backend for every check-in of the last moment.
        while True:
            first = self._queue.get()
            if first is None:
                return
            time.sleep(CLEANUP_BATCH_S)
            batch = [first]
            stop = False
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            try:
                reader = self.host.reader
                procs = reader.processes() if reader is not None else []
                self.finish(*batch)  # cgroups and node holders first: at once, no grace after a check-in
                for h in batch:
                    if any(alive(p, h.session.uid) for p in pids_on(procs, h.slice, h.session.uid)):
                        self.terminate(h)
            except Exception:
                log.exception("cleaning up after %s failed", ", ".join(h.session.id for h in batch))
            if stop:
                return

    def terminate(self, h: Held) -> list[int]:
        """SIGTERM the holder's processes on the slice and in the session's cgroup (the GPU backend
        lists only what has a context open: a launcher or a child that has not reached the GPU is in
        the cgroup alone), SIGKILL after the grace; returns the pids hit."""
        uid = h.session.uid
        sid = h.session.id
        hit: set[int] = set()
        deadline = time.monotonic() + self.host.config.kill_grace
        while True:
            listed = processes_on(self.host.reader, h.slice, uid) + self.cgroups.pids(sid)
            pids = [p for p in dict.fromkeys(listed) if alive(p, uid)]
            fresh = [p for p in pids if p not in hit]
            hit.update(signal_pids(fresh, uid, signal.SIGTERM))
            still = [p for p in hit if alive(p, uid)]
            if not still and not fresh:
                return sorted(hit)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        signal_pids([p for p in hit if alive(p, uid)], uid, signal.SIGKILL)
        end = time.monotonic() + 2.0
        while time.monotonic() < end and any(alive(p, uid) for p in hit):
            time.sleep(0.02)
        return sorted(hit)
