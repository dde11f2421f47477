"""Which requests have a client waiting on them now, and since when the others have had none.

A waiting client holds its connection open (or reconnects with its request id); the thread serving
it attaches to the request while it waits. A queued request with no client past the claim window is
dropped (``dispatch.py``), and one with no client now is no demand for more hosts (``demand.py``).
In memory: after a restart every request counts as without a client since the start, and its client
(reconnecting within ``reconnect_for``) attaches again.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable


class Presence:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started = clock()
        self._attached: collections.Counter[str] = collections.Counter()
        self._left: dict[str, float] = {}  # request -> when its last client left
        self._lock = threading.Lock()

    def attach(self, request_id: str) -> None:
        with self._lock:
            self._attached[request_id] += 1
            self._left.pop(request_id, None)

    def detach(self, request_id: str) -> None:
        with self._lock:
            self._attached[request_id] -= 1
            if self._attached[request_id] <= 0:
                del self._attached[request_id]
                self._left[request_id] = self._clock()

    def absent_for(self, request_id: str) -> float | None:
        """Seconds ``request_id`` has had no client (None while one waits on it)."""
        with self._lock:
            if request_id in self._attached:
                return None
            return self._clock() - self._left.get(request_id, self._started)

    def present(self, request_id: str) -> bool:
        return self.absent_for(request_id) is None

    def forget(self, keep: set[str]) -> None:
        """Drop what is known of requests no longer live (``keep``: the live ones)."""
        with self._lock:
            for rid in [r for r in self._left if r not in keep]:
                del self._left[rid]
