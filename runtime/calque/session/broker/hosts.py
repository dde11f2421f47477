"""What the broker knows of every host: its slices as last listed, and whether it answers.

The host daemons are authoritative; this is a cache. A host's daemon nudges the broker when a slice
there is taken or freed (a nudge carries nothing to believe: it only makes the broker list that host
now), and every host is listed every ``poll_every`` seconds whatever arrives, so a lost nudge or a
forged one costs one list call, never a wrong grant: the grant itself is the host's checkout.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from calque.errors import CalqueError
from calque.models.broker import HostView
from calque.models.session import SliceState

log = logging.getLogger("calque.broker")


class HostLink(Protocol):
    """A typed client of one host's daemon (``calque.session.remote.RemoteHost``): ``as_user`` makes
    the call for that user (the host accepts it from the broker's service user only). A host that
    cannot be connected to raises ``UnreachableError`` (nothing reached it); one that broke off after
    the request went, another ``CalqueError`` (it may have done it)."""

    def call(self, op: str, args: dict[str, Any], *, request_id: str, as_user: str | None = None) -> Any: ...


@dataclass
class _Seen:
    view: HostView
    polled_at: float = 0.0  # monotonic
    sessions: set[str] = field(default_factory=set)
    version: int = 0  # bumped whenever a list shows other busy slices than the last one
    # Grants made here since (session id -> the mark's sequence number, its slice, its end): a list the
    # host answered before one of them and stored after it must not show that slice free again.
    marks: dict[str, tuple[int, str, datetime]] = field(default_factory=dict)


def call_id() -> str:
    """A fresh request id for a call that changes nothing (a list): each credential is its own."""
    return "b-" + os.urandom(12).hex()


class HostCache:
    def __init__(self, links: Mapping[str, HostLink]) -> None:
        self.links = dict(links)
        self._lock = threading.Lock()
        self._seen = {name: _Seen(HostView(name=name, reachable=False)) for name in self.links}
        self._marked = 0  # the sequence of ``taken`` marks, across hosts

    @property
    def names(self) -> list[str]:
        return sorted(self.links)

    def refresh(self, name: str) -> tuple[HostView, set[str]]:
        """List ``name`` as the broker (its holders included); returns the view and the ids of the
        sessions that host held at the last list and no longer does (they ended)."""
        now = datetime.now(timezone.utc)
        link = self.links.get(name)
        if link is None:  # it left (``remove``) since the loop picked it
            return HostView(name=name, reachable=False), set()
        with self._lock:
            asked_after = self._marked  # grants marked after this may be missing from the answer
        try:
            raw = link.call("list", {}, request_id=call_id())
            slices = [SliceState.model_validate(s) for s in raw]
        except (CalqueError, OSError, ValueError) as exc:
            with self._lock:
                if name not in self._seen:
                    return HostView(name=name, reachable=False), set()
                seen = self._seen[name]
                seen.view = seen.view.model_copy(update={"reachable": False, "error": str(exc)})
                seen.polled_at = time.monotonic()
            log.warning("host %s does not answer: %s", name, exc)
            return seen.view, set()
        live = {s.session_id for s in slices if s.session_id}
        with self._lock:
            if name not in self._seen:
                return HostView(name=name, reachable=True, seen_at=now, slices=slices), set()
            seen = self._seen[name]
            # A grant made while this list was on its way is not in it: its slice stays busy (the host
            # made that session; the next list shows it). Older marks are in the answer, or ended.
            marks = {sid: m for sid, m in seen.marks.items() if m[0] > asked_after and sid not in live}
            by_slice = {slice_id: (sid, until) for sid, (_, slice_id, until) in marks.items()}
            slices = [_busy(s, *by_slice[s.slice.id]) if s.slice.id in by_slice else s for s in slices]
            live |= set(marks)
            view = HostView(name=name, reachable=True, seen_at=now, slices=slices)
            ended = seen.sessions - live
            changed = live != seen.sessions or not seen.view.reachable
            self._seen[name] = _Seen(view, time.monotonic(), live, seen.version + int(changed), marks)
        return view, ended

    def add(self, name: str, link: HostLink) -> bool:
        """A host that registered (an elastic session host): listed from the next step on. False if known."""
        with self._lock:
            if name in self.links:
                return False
            self.links[name] = link
            self._seen[name] = _Seen(HostView(name=name, reachable=False))
            return True

    def remove(self, name: str) -> None:
        """A host whose registration is gone (it left its class): no longer listed or granted on."""
        with self._lock:
            self.links.pop(name, None)
            self._seen.pop(name, None)

    def version(self, name: str) -> int:
        """Changes whenever the host's busy slices do: a request it answered busy is asked again only then."""
        with self._lock:
            seen = self._seen.get(name)
            return seen.version if seen else -1

    def due(self, every: float) -> list[str]:
        """Hosts not listed for ``every`` seconds."""
        now = time.monotonic()
        with self._lock:
            return [n for n, s in sorted(self._seen.items()) if now - s.polled_at >= every]

    def views(self) -> list[HostView]:
        with self._lock:
            return [self._seen[n].view for n in sorted(self._seen)]

    def view(self, name: str) -> HostView:
        with self._lock:
            seen = self._seen.get(name)
            return seen.view if seen else HostView(name=name, reachable=False, error="not registered")

    def down(self, name: str, why: str) -> None:
        """The host refused the connection: unreachable in the cache until its next list answers."""
        with self._lock:
            seen = self._seen.get(name)
            if seen is not None:
                seen.view = seen.view.model_copy(update={"reachable": False, "error": why})

    def taken(self, name: str, slice_id: str, session_id: str, until: datetime) -> None:
        """A grant just made there: that slice is busy in the cache until the host's next list."""
        with self._lock:
            seen = self._seen.get(name)
            if seen is None:  # it left its class meanwhile
                return
            self._marked += 1
            seen.marks[session_id] = (self._marked, slice_id, until)
            slices = [_busy(s, session_id, until) if s.slice.id == slice_id else s for s in seen.view.slices]
            seen.view = seen.view.model_copy(update={"slices": slices})
            seen.sessions.add(session_id)


def _busy(s: SliceState, session_id: str, until: datetime) -> SliceState:
    """``s`` held by ``session_id`` until ``until``."""
    return s.model_copy(update={"busy": True, "busy_until": until, "session_id": session_id})


def matching(view: HostView, kind: str, profile: str | None, gpu: int | None = None) -> list[SliceState]:
    """The slices of ``kind`` (and ``profile``, and on GPU ``gpu``, when given) the host has, free or not."""
    return [
        s
        for s in view.slices
        if s.slice.kind == kind
        and (profile is None or s.slice.profile == profile)
        and (gpu is None or s.slice.gpu_index == gpu)
    ]


def free_matching(view: HostView, kind: str, profile: str | None, gpu: int | None = None) -> list[SliceState]:
    """The matching slices a checkout there could get: free, not on a drained GPU (or host), and not
    an MPS slot whose control daemon does not answer."""
    return [s for s in matching(view, kind, profile, gpu) if offered(s)] if view.reachable else []


def offered(s: SliceState) -> bool:
    """Free and grantable: neither busy, drained nor ``unavailable`` (its MPS daemon down)."""
    return not s.busy and s.drained is None and not s.unavailable
