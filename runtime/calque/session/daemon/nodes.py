"""A session's start and end as the capability nodes see them, for every component that starts or
ends one (the service, the enforcer, the guard): the nodes are changed only under the host's node
lock, so a concurrent check-in and checkout never undo each other.

The hand-over: a MIG slice whose last holder was another uid may still be open in that uid's
processes (chown, chmod and ACLs never revoke a descriptor), so before a checkout of it answers,
every process of anyone but the new holder that holds one of its nodes is ended and gone.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from calque.models.session import EndReason
from calque.session.daemon import holders, isolation
from calque.session.daemon.host import Host
from calque.session.daemon.rows import Held
from calque.session.daemon.wire import RequestError

log = logging.getLogger("calque.session")

_warned: set[str] = set()  # node warnings already logged by this process (once per node, not per checkout)


def hand_over(host: Host, held: Held) -> list[int]:
    """End every process but the new holder's (and root's) holding the slice's nodes; the pids ended."""
    if held.slice.kind != "mig":
        return []
    try:
        nodes = [n.device for n in isolation.cap_nodes(host.root, held.slice)]
    except (OSError, ValueError):
        return []
    found = holders.holders(holders.keys_of(nodes))
    return holders.end_holders(found, keep_uid=held.session.uid, wait=5.0) if found else []


def grant(host: Host, held: Held, fresh: bool) -> None:
    """The slice's nodes to its holder (after the hand-over, for a fresh checkout from another uid); a
    session whose nodes cannot be handed out is ended again and the caller told."""
    try:
        with host.nodes_lock:
            if fresh and held.handed_from is not None:
                ended = hand_over(host, held)
                if ended:
                    log.info("hand-over of %s: ended pids %s of its last holder(s)", held.slice.id, ended)
            warnings = isolation.grant(host.root, held.slice, held.session.uid)
        for w in warnings:
            if w not in _warned:
                _warned.add(w)
                log.warning("%s", w)
    except (OSError, ValueError) as exc:
        host.registry.end(held.session.id, "vanished", time.time())
        raise RequestError(
            "internal",
            f"cannot hand {held.slice.id} to you: capability nodes: {exc}; an admin must check the MIG setup",
        ) from exc


def end_session(
    host: Host,
    sid: str,
    reason: EndReason,
    event: str,
    by_uid: int,
    note: str | None = None,
    owner: int | None = None,
    **audit: Any,
) -> Held | None:
    """End a live session (only if ``owner``'s, when given, checked in the same transaction): the
    registry row, then its nodes back to root, then the audit line (with ``audit``'s fields). None
    when nothing was live."""
    ended = host.registry.end(sid, reason, time.time(), owner=owner)
    if ended is None:
        return None
    try:
        with host.nodes_lock:
            isolation.revoke(host.root, ended.slice)
    except (OSError, ValueError) as exc:
        log.error("cannot take back capability nodes of %s: %s", ended.slice.id, exc)
    host.audit.record(event, ended, by_uid=by_uid, reason=note or reason, **audit)
    host.changed()
    return ended


def reassert_nodes(host: Host) -> None:
    """Holders' nodes back to them, free MIG slices' nodes back to root alone (the driver creates
    new ones world-readable, 0444, and may reset modes). Reads the registry under the node lock,
    so a concurrent check-in or checkout is never undone."""
    try:
        slices = host.inventory.slices()
    except RequestError as exc:
        log.error("cannot list slices to secure them: %s", exc)
        return
    with host.nodes_lock:
        holder_of = {h.session.slice_id: h.session.uid for h in host.registry.live()}
        for sl in slices:
            if sl.kind != "mig":
                continue
            try:
                if sl.id in holder_of:
                    isolation.grant(host.root, sl, holder_of[sl.id])
                else:
                    isolation.revoke(host.root, sl)
            except (OSError, ValueError) as exc:
                log.error("cannot re-assert capability nodes of %s: %s", sl.id, exc)


def reconcile(host: Host) -> None:
    """After a (re)start: holders keep their nodes, free slices go back to root, vanished slices end."""
    slices = {s.id: s for s in host.inventory.slices(fresh=True)}
    held_ids = set()
    for h in host.registry.live():
        if h.session.slice_id not in slices:
            log.warning("slice %s of session %s is gone from the GPU; ending it", h.session.slice_id, h.session.id)
            end_session(host, h.session.id, "vanished", "vanished", 0)
            continue
        held_ids.add(h.session.slice_id)
        try:
            isolation.grant(host.root, h.slice, h.session.uid)
        except (OSError, ValueError) as exc:
            log.error("cannot re-grant %s to uid %d: %s", h.slice.id, h.session.uid, exc)
    for sid, sl in slices.items():
        if sid in held_ids:
            continue
        try:
            isolation.revoke(host.root, sl)
        except (OSError, ValueError) as exc:
            log.error("cannot secure capability nodes of %s: %s", sid, exc)
