"""The metrics endpoint and textfile (``calque.exposition``): prometheus_client's output, served bounded."""

from __future__ import annotations

import contextlib
import socket
import urllib.request
from pathlib import Path

import pytest
from calque.errors import UsageError
from calque.exposition import serve, write_textfile
from calque.models import PoolSpec
from calque.pool.worker.worker_metrics import Metrics
from prometheus_client.parser import text_string_to_metric_families
from support.waits import HANG_S


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model", "worker")))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _worker_metrics() -> Metrics:
    m = Metrics({"model": "org/m", "worker": "w1"})
    m.inc("calque_pool_claims_total", outcome="ok")
    for seconds in (0.02, 0.3, 7.0):
        m.observe("calque_pool_claim_seconds", seconds)
    return m


def test_claim_time_is_a_histogram_scraped_from_the_real_endpoint() -> None:
    m = _worker_metrics()
    port = m.serve(0)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        m.close()
    samples = _samples(text)
    assert samples[("calque_pool_claims_total", (("outcome", "ok"),))] == 1
    assert samples[("calque_pool_claim_seconds_count", ())] == 3
    assert samples[("calque_pool_claim_seconds_bucket", (("le", "0.05"),))] == 1
    assert samples[("calque_pool_claim_seconds_bucket", (("le", "0.5"),))] == 2
    assert samples[("calque_pool_claim_seconds_bucket", (("le", "+Inf"),))] == 3
    assert samples[("calque_pool_claim_seconds_sum", ())] == pytest.approx(7.32)


def test_the_endpoint_binds_loopback_by_default_and_refuses_a_name_for_an_address() -> None:
    m = _worker_metrics()
    port = m.serve(0)
    try:
        assert m._endpoint is not None and m._endpoint._server.server_address[0] == "127.0.0.1"
    finally:
        m.close()
    with pytest.raises(UsageError, match="not an IP address"):
        m.serve(0, "metrics.example")
    with pytest.raises(ValueError, match="not an IP address"):
        PoolSpec.model_validate({"model": "m", "workload": "/w.py", "bucket": "bkt", "metrics_addr": "localhost"})
    assert port > 0


def test_idle_clients_never_take_a_thread_each_and_once_gone_the_endpoint_serves_again() -> None:
    import threading

    m = _worker_metrics()
    port = m.serve(0)
    threads = threading.active_count()
    idle = []
    try:
        for _ in range(24):  # three times the backlog: the rest wait in SYN retries, never in a thread
            c = socket.socket()
            c.settimeout(0.2)
            with contextlib.suppress(OSError):
                c.connect(("127.0.0.1", port))
            idle.append(c)
        assert threading.active_count() == threads  # one serving thread, whatever the clients do
        for c in idle:
            c.close()
        # They gone, it serves again (how soon is a timing goal: bench/, not here).
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=HANG_S).read().decode()
        assert _samples(text)[("calque_pool_claim_seconds_count", ())] == 3
    finally:
        for c in idle:
            c.close()
        m.close()


def test_the_textfile_is_replaced_atomically_and_a_directory_is_refused(tmp_path: Path) -> None:
    m = _worker_metrics()
    prom = tmp_path / "calque-pool.prom"
    prom.write_text("stale\n")
    m.write_textfile(str(prom))
    assert _samples(prom.read_text())[("calque_pool_claim_seconds_count", ())] == 3
    assert [p.name for p in tmp_path.iterdir()] == [prom.name]  # no temporary file left beside it
    with pytest.raises(UsageError, match="is a directory"):
        write_textfile(m.registry, tmp_path)
    with pytest.raises(UsageError, match="cannot serve metrics"), socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        serve(m.registry, taken.getsockname()[1])
