"""The pool queue's backlog in a worker's metrics: visible and in-flight messages, read every
``backlog_poll_s`` on a thread of its own while the worker's metrics are on.

A scrape never calls SQS (the endpoint answers from the last reading, so a slow or failing SQS
cannot hold it); a failed reading drops the samples until the next one succeeds, so a dashboard
shows a gap rather than a stale backlog. What the scaling policy sums (``calque.aws.acquire.scaling``)
is the same pair, so a rule's backlog per instance is the policy's own figure.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from calque.aws.queue import PoolQueue
from calque.errors import CalqueError
from calque.pool.worker.worker_metrics import Metrics

log = logging.getLogger("calque.pool.worker.backlog")
NAME = "calque_pool_queue_messages"


class BacklogSampler:
    """Reads ``queue.backlog()`` into ``metrics`` every ``every_s`` until ``stop`` is set."""

    def __init__(
        self,
        queue: PoolQueue,
        metrics: Metrics,
        every_s: float,
        stop: threading.Event,
        after: Callable[[], None] = lambda: None,
    ) -> None:
        self.queue = queue
        self.metrics = metrics
        self.every_s = every_s
        self.stop = stop
        self.after = after  # the worker's textfile, rewritten after each reading
        self._failing = False

    def sample(self) -> bool:
        """One reading; False (and no samples) when SQS did not answer."""
        try:
            visible, in_flight = self.queue.backlog()
        except CalqueError as exc:
            if not self._failing:  # once per outage, not once per reading
                log.warning("cannot read the queue's backlog for the metrics: %s", exc)
            self._failing = True
            self.metrics.clear(NAME)
            return False
        self._failing = False
        self.metrics.set(NAME, visible, state="visible")
        self.metrics.set(NAME, in_flight, state="in_flight")
        return True

    def loop(self) -> None:
        while True:
            self.sample()
            self.after()
            if self.stop.wait(self.every_s):
                return
