"""Prometheus text metrics of one worker: on a loopback port, or a node_exporter textfile."""

from __future__ import annotations

import os
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_HELP = {
    "calque_pool_claims_total": ("counter", "Claims finished, by outcome."),
    "calque_pool_items_total": ("counter", "Items run, by outcome."),
    "calque_pool_warm_hits_total": ("counter", "Claims served without a fresh @enter."),
    "calque_pool_enter_count": ("gauge", "Times this worker process has run @enter (1 when healthy)."),
    "calque_pool_enter_seconds": ("gauge", "Seconds the @enter hooks took."),
    "calque_pool_claim_seconds_sum": ("counter", "Seconds spent serving claims."),
    "calque_pool_claim_seconds_count": ("counter", "Claims served."),
    "calque_pool_leases_held": ("gauge", "Claims this worker holds now (running, prefetched, writing)."),
    "calque_pool_leases_lost_total": ("counter", "Claims whose visibility could not be extended."),
    "calque_pool_up": ("gauge", "1 while the worker serves, 0 once it is shutting down."),
}


class Metrics:
    """Thread-safe counters rendered as Prometheus text; labels are a fixed set of (key, value)."""

    def __init__(self, labels: dict[str, str]) -> None:
        self._labels = labels
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def inc(self, name: str, by: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + by

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._values[(name, tuple(sorted(labels.items())))] = value

    def get(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._values.get((name, tuple(sorted(labels.items()))), 0.0)

    def render(self) -> str:
        with self._lock:
            values = dict(self._values)
        lines: list[str] = []
        for name in sorted({n for n, _ in values}):
            kind, text = _HELP.get(name, ("untyped", name))
            base = name.removesuffix("_sum").removesuffix("_count")
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind if base == name else 'counter'}"]
            for (n, labels), v in sorted(values.items()):
                if n != name:
                    continue
                all_labels = {**self._labels, **dict(labels)}
                lab = ",".join(f'{k}="{_escape(str(val))}"' for k, val in sorted(all_labels.items()))
                lines.append(f"{name}{{{lab}}} {v:g}")
        return "\n".join(lines) + "\n"

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics on ``host:port`` (0 picks a free port); returns the port."""
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = metrics.render().encode()
                self.send_response(200 if self.path in ("/metrics", "/") else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                return None

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="calque-metrics", daemon=True).start()
        return int(self._server.server_address[1])

    def write_textfile(self, path: str) -> None:
        """Atomically replace ``path`` (node_exporter's textfile collector reads *.prom files)."""
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".calque-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(self.render())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
