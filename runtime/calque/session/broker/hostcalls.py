"""The broker's calls to hosts, each on a thread of its own, so that no host's silence holds the
dispatch loop (or another host's grant). Per host there are two lanes, ``list`` (what it has free)
and ``change`` (a grant, a retry of one, a give-back): at most one call in flight in each, so two
grants never race for one host's slices in the broker, and a hung host ties up two threads, not the
loop. A call in flight longer than ``answer_within`` marks its host not answering in the cache (no
grant goes there) while it goes on, up to the link's own timeout; its answer, when it comes, is the
host's next view.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

log = logging.getLogger("calque.broker")

Lane = Literal["list", "change"]


class HostCalls:
    def __init__(self, answer_within: float, on_done: Callable[[], None]) -> None:
        self.answer_within = answer_within
        self.on_done = on_done  # the loop looks again at once when a call ends
        self._lock = threading.Lock()
        self._since: dict[tuple[str, Lane], float] = {}  # in flight: (host, lane) -> monotonic start

    def run(self, host: str, lane: Lane, call: Callable[[], None]) -> bool:
        """Start ``call`` unless ``host`` has one in flight in ``lane``; False then (nothing started)."""
        with self._lock:
            if (host, lane) in self._since:
                return False
            self._since[(host, lane)] = time.monotonic()
        threading.Thread(target=self._one, args=(host, lane, call), name=f"host-{lane}-{host}", daemon=True).start()
        return True

    def busy(self, host: str, lane: Lane) -> bool:
        with self._lock:
            return (host, lane) in self._since

    def silent(self) -> dict[str, float]:
        """Hosts with a call in flight for longer than ``answer_within``: how long, the longest."""
        now = time.monotonic()
        out: dict[str, float] = {}
        with self._lock:
            for (host, _), since in self._since.items():
                if now - since > self.answer_within:
                    out[host] = max(out.get(host, 0.0), now - since)
        return out

    def _one(self, host: str, lane: Lane, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception:
            log.exception("a %s call to host %s failed", lane, host)
        finally:
            with self._lock:
                self._since.pop((host, lane), None)
            self.on_done()
