"""Work that leaves its session's cgroup is ended: a session's processes cannot get out of it alive.

On a systemd host a user may ask their own user manager to move one of their processes into their
own units (``systemd-run --user --scope``, or ``AttachProcessesToUnit`` on the user bus): systemd
checks only that the process and the target unit are the same user's, so a process started with
``calque session run`` could leave ``calque-<sid>.scope`` (and its device policy) and outlive the
session. The kernel keeps no history of a process's cgroups, so the main process keeps one: at each
timer tick it records every process in each session's cgroup and every descendant of one (a child
is born in its parent's cgroup, so a descendant outside the cgroup has left it), by pid and start
time (a reused pid is another process). A recorded process found outside its session's cgroup is
ended at once, with its descendants, and so is every one still alive once the session has ended.

What a user starts through another door (a ``systemd-run --user`` service, an ssh login, cron) was
never in the session: it keeps running, but without the slice (docs/session.md, "Ways out").
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from calque.session.daemon.cgroup import SessionCgroups
from calque.session.daemon.rows import Held

log = logging.getLogger("calque.session")

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live, non-zombie process; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def _processes_of(uids: set[int]) -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) of every live process owned by one of ``uids``."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid not in uids:
                continue
        except OSError:
            continue
        st = _stat(int(name))
        if st is not None:
            out[int(name)] = st
    return out


class ScopeWatch:
    def __init__(self, cgroups: SessionCgroups) -> None:
        self.cgroups = cgroups
        self._joined: dict[str, tuple[int, set[Proc]]] = {}  # session id -> (holder uid, processes seen)

    def tick(self, live: list[Held], with_cgroup: list[str]) -> dict[str, list[int]]:
        """Record the live sessions' processes; end those that left and every one of a session no
        longer live. Returns the pids ended, by session id."""
        ended: dict[str, list[int]] = {}
        live_ids = {h.session.id for h in live}
        watched = [h for h in live if h.session.id in with_cgroup or h.session.id in self._joined]
        gone = [sid for sid in self._joined if sid not in live_ids]
        if not watched and not gone:
            return ended
        procs = _processes_of({h.session.uid for h in watched} | {self._joined[s][0] for s in gone})
        for h in watched:
            sid, uid = h.session.id, h.session.uid
            inside = {p for p in self.cgroups.pids(sid) if p in procs}
            before = self._joined.get(sid, (uid, set()))[1]
            family = _descendants(procs, inside | _alive(before, procs))
            self._joined[sid] = (uid, {(p, procs[p][1]) for p in family})  # the dead are forgotten
            out = sorted(p for p in family if p not in inside)
            if out:
                log.warning("session %s: pids %s left its cgroup; ending them", sid, out)
                ended[sid] = _kill(out)
        for sid in gone:
            _, seen = self._joined.pop(sid)
            family = _descendants(procs, _alive(seen, procs))
            if family:
                log.warning("session %s has ended: ending pids %s that had left its cgroup", sid, sorted(family))
                ended[sid] = _kill(sorted(family))
        return ended


def _alive(seen: set[Proc], procs: dict[int, tuple[int, int]]) -> set[int]:
    """The pids of ``seen`` still running as the same process (a reused pid has another start time)."""
    return {p for p, start in seen if p in procs and procs[p][1] == start}


def _descendants(procs: dict[int, tuple[int, int]], roots: set[int]) -> set[int]:
    """``roots`` and every process below one of them (by parent pid, among ``procs``)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(roots), list(roots)
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _kill(pids: list[int]) -> list[int]:
    hit = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            hit.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return hit
