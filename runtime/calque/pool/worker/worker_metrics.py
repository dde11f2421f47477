"""A worker's Prometheus metrics (``prometheus_client``): on a bounded endpoint, or a node_exporter textfile.

Every sample carries the worker's constant labels (``model``, ``worker``, and ``pool`` for a named
pool: ``lab-a/embedder``, whose lab a dashboard reads from it); a few carry ``outcome``.
Claim time is a histogram (``calque_pool_claim_seconds_bucket``/``_sum``/``_count``). The queue's
messages (``state``: visible, in_flight) are sampled by ``calque.pool.worker.backlog`` while metrics are on;
with the spec's ``backlog_target`` beside them, a rule compares backlog per instance to its target.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from calque import exposition

# Claims run from milliseconds (a no-op batch) to hours (a long fine-tune shard).
CLAIM_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600)

_DEFS: dict[str, tuple[type[Counter] | type[Gauge] | type[Histogram], str, tuple[str, ...]]] = {
    "calque_pool_claims_total": (Counter, "Claims finished, by outcome.", ("outcome",)),
    "calque_pool_items_total": (Counter, "Items run, by outcome.", ("outcome",)),
    "calque_pool_warm_hits_total": (Counter, "Claims served without a fresh @enter.", ()),
    "calque_pool_leases_lost_total": (Counter, "Claims whose visibility could not be extended.", ()),
    "calque_pool_enter_count": (Gauge, "Times this worker process has run @enter (1 when healthy).", ()),
    "calque_pool_enter_seconds": (Gauge, "Seconds the @enter hooks took.", ()),
    "calque_pool_leases_held": (Gauge, "Claims this worker holds now (running, prefetched, writing).", ()),
    "calque_pool_up": (Gauge, "1 while the worker serves, 0 once it is shutting down.", ()),
    "calque_pool_claim_seconds": (Histogram, "Seconds from a claim's first item to its last.", ()),
    "calque_pool_queue_messages": (Gauge, "The pool queue's messages as SQS counts them, by state.", ("state",)),
    "calque_pool_backlog_target": (Gauge, "Claims per instance the pool's scaling aims at (spec backlog_target).", ()),
}


def worker_labels(model: str, worker_id: str, pool: str | None) -> dict[str, str]:
    """The constant labels of a worker's samples."""
    return {"model": model, "worker": worker_id, **({"pool": pool} if pool else {})}


class Metrics:
    """The worker's metrics in their own registry; ``inc``/``set``/``observe`` by name, thread-safe."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._labels = dict(labels)
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}
        for name, (kind, text, extra) in _DEFS.items():
            names = (*self._labels, *extra)
            if kind is Histogram:
                self._metrics[name] = Histogram(name, text, names, registry=self.registry, buckets=CLAIM_BUCKETS_S)
            else:
                self._metrics[name] = kind(name, text, names, registry=self.registry)
        self._endpoint: exposition.MetricsEndpoint | None = None

    def _child(self, name: str, labels: dict[str, str]) -> Counter | Gauge | Histogram:
        return self._metrics[name].labels(**self._labels, **labels)

    def inc(self, name: str, by: float = 1.0, **labels: str) -> None:
        child = self._child(name, labels)
        assert isinstance(child, (Counter, Gauge)), name
        child.inc(by)

    def set(self, name: str, value: float, **labels: str) -> None:
        child = self._child(name, labels)
        assert isinstance(child, Gauge), name
        child.set(value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        child = self._child(name, labels)
        assert isinstance(child, Histogram), name
        child.observe(value)

    def clear(self, name: str) -> None:
        """Drop every sample of ``name`` (a reading that failed: a gap, not a stale value)."""
        self._metrics[name].clear()

    def get(self, name: str, **labels: str) -> float:
        """A sample's current value (0 when never set): ``calque_pool_claims_total``, ``..._count``."""
        value = self.registry.get_sample_value(name, {**self._labels, **labels})
        return 0.0 if value is None else value

    def serve(self, port: int, addr: str = exposition.DEFAULT_ADDR) -> int:
        """Serve /metrics on ``addr:port`` (0 picks a free port); returns the port."""
        self._endpoint = exposition.serve(self.registry, port, addr, name="calque-metrics")
        return self._endpoint.port

    def write_textfile(self, path: str) -> None:
        """Atomically replace ``path`` (node_exporter's textfile collector reads *.prom files)."""
        exposition.write_textfile(self.registry, path)

    def close(self) -> None:
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
