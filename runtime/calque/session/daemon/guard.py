"""The nodes' guard (main process): who may hold a slice's nodes open, and the MPS pipe directories.

chown, chmod and ACLs never revoke a descriptor already open, so whoever holds a node they may not
(a free slice's node, or another uid's slice's node) is ended (``holders.py``). Walking
``/proc/*/fd`` costs tens of milliseconds, so the guard walks only for nodes that were *opened*
since their last walk, which inotify reports (``watch.py``): a session whose nodes nobody opened
ends without a walk; one whose nodes were opened gets a walk on the next tick after it ends (within
``MAX_SLEEP_S``). Every ``reassert_every`` every opened node is walked, whoever holds the slice, which
also catches a descriptor passed to another user over a unix socket. Without inotify every node
counts as opened.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from pathlib import Path

from calque.session.daemon import holders, isolation
from calque.session.daemon.host import Host
from calque.session.daemon.inventory import owner_of
from calque.session.daemon.rows import Held
from calque.session.daemon.watch import NodeWatch

log = logging.getLogger("calque.session")


class NodeGuard:
    def __init__(self, host: Host) -> None:
        self.host = host
        self._lock = threading.Lock()
        self._opened: set[Path] = set()
        self._unknown = True  # until the first full walk: what was opened before we started is unknown
        self._free_before: set[str] = set()
        self._map: tuple[tuple[str, ...], dict[Path, str]] = ((), {})
        self.watch = NodeWatch(host.root / "dev/nvidia-caps", self._event)
        self.watching = False

    def start(self) -> None:
        self.watching = self.watch.start()

    def stop(self) -> None:
        self.watch.stop()

    def _event(self, path: Path, opened: bool) -> None:
        if opened:
            with self._lock:
                self._opened.add(path)
        if path.name.startswith("nvidia-cap"):
            self.secure_node(path)

    def secure_node(self, path: Path) -> None:
        """A node that appeared or changed mode: its holder's (ACL) if a live session's, else root's alone."""
        try:
            st = os.lstat(path)
        except OSError:
            return
        if st.st_uid == 0 and st.st_mode & 0o007 == 0 and (st.st_mode & 0o070 == 0 or isolation.acl_users(path)):
            return  # as the daemon leaves nodes (its own changes come back here as events)
        with self.host.nodes_lock:
            holder = None
            for h in self.host.registry.live():
                try:
                    if any(n.device == path for n in isolation.cap_nodes(self.host.root, h.slice)):
                        holder = h.session.uid
                        break
                except (OSError, ValueError):
                    continue
            if stat.S_ISCHR(st.st_mode) or stat.S_ISREG(st.st_mode):
                isolation.close_node(path, holder)

    def _nodes(self) -> dict[Path, str]:
        """Node path -> MIG slice id (cached while the set of slices is the same)."""
        try:
            slices = [sl for sl in self.host.inventory.slices() if sl.kind == "mig"]
        except Exception as exc:
            log.error("cannot list slices to guard their nodes: %s", exc)
            return self._map[1]
        ids = tuple(sl.id for sl in slices)
        if ids != self._map[0]:
            out = {}
            for sl in slices:
                try:
                    for n in isolation.cap_nodes(self.host.root, sl):
                        out[n.device] = sl.id
                except (OSError, ValueError):
                    continue
            self._map = (ids, out)
        return self._map[1]

    def check(self, live: list[Held], everything: bool) -> None:
        """End processes holding nodes they may not: of newly free slices (each tick), of any slice
        (``everything``, every ``reassert_every``); only nodes opened since their last walk."""
        nodes = self._nodes()
        holder_of = {h.slice.id: h.session.uid for h in live}
        free_now = {sid for sid in nodes.values() if sid not in holder_of}
        with self._lock:
            opened = set(self._opened)
            unknown = self._unknown or not self.watching
        if everything:
            walk = {p for p in nodes if unknown or p in opened}
        else:
            newly_free = free_now - self._free_before
            walk = {
                p for p, sid in nodes.items() if sid in free_now and (p in opened or (unknown and sid in newly_free))
            }
        self._free_before = free_now
        if not walk:
            return
        for pid, held in holders.holders(holders.keys_of(walk)).items():
            uid = owner_of(pid)
            if uid is not None and any(holder_of.get(nodes[p]) != uid for p in held):
                holders.end_holders({pid: held})
        with self._lock:
            # A held slice's nodes stay "opened": its holder may have them open until the end.
            self._opened -= {p for p in walk if nodes[p] in free_now}
            if everything:
                self._opened |= {p for p in walk if nodes[p] not in free_now}
                self._unknown = False

    def secure_pipes(self, live: list[Held]) -> None:
        """Each MPS pipe directory: root's, reachable by exactly the uids holding a slot on it."""
        cfg = self.host.config
        pipes: dict[str, set[int]] = {
            m.pipe_directory or str(cfg.mps_pipe_root / f"gpu{m.gpu}"): set() for m in cfg.mps
        }
        for h in live:
            if h.slice.kind == "mps" and h.slice.pipe_directory:
                pipes.setdefault(h.slice.pipe_directory, set()).add(h.session.uid)
        for pipe, uids in pipes.items():
            try:
                isolation.set_pipe_holders(pipe, uids)
            except OSError as exc:
                log.error("cannot secure MPS pipe directory %s: %s", pipe, exc)
