"""Every host's own record of its sessions over the fair share window, for the queue's order
(``fairness.lab_usage``): the broker asks each host's daemon for its ledger (as itself: every user's
sessions, however granted, each with the lab it is billed to) every ``usage_every`` seconds, in a
thread of its own so that the dispatch loop never waits on it. A host that does not answer keeps its
last answer; one that never answered is counted by the broker's own grants there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

from pydantic import ValidationError

from calque.errors import CalqueError
from calque.models.ledger import HostLedger
from calque.session.broker.fairness import Span
from calque.session.broker.hosts import HostLink, call_id

log = logging.getLogger("calque.broker")
Recorded = Mapping[str, tuple[float, Sequence[Span]]]


class HostRecords:
    def __init__(self, links: Mapping[str, HostLink], window: float, every: float) -> None:
        self.links = links  # the cache's own mapping: elastic hosts join it as they register
        self.window = window
        self.every = every
        self._copies: dict[str, tuple[float, list[Span]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def recorded(self) -> Recorded:
        with self._lock:
            return dict(self._copies)

    def refresh(self) -> None:
        for name, link in sorted(dict(self.links).items()):  # a copy: a host may register meanwhile
            try:
                raw = link.call("ledger", {"since": f"{self.window:.0f}"}, request_id=call_id())
                answer = HostLedger.model_validate(raw)
            except (CalqueError, ValidationError) as exc:
                log.info("fair share: host %s's sessions not read now (%s); its last answer counts", name, exc)
                continue
            spans = [
                Span(e.lab or "default", name, e.started_at.timestamp(), e.ended_at.timestamp())
                for e in answer.events
                if e.source == "session"
            ]
            with self._lock:
                self._copies[name] = (answer.taken_at.timestamp(), spans)

    def start(self) -> None:
        def loop() -> None:
            while True:
                try:
                    self.refresh()
                except Exception:  # a broken round is logged; the next one tries again
                    log.exception("fair share: reading the hosts' sessions failed")
                if self._stop.wait(self.every):
                    return

        self._thread = threading.Thread(target=loop, name="broker-fair-usage", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
