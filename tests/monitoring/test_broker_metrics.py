"""The broker process serves its queue's metrics: a real broker over a real daemon, a real second
user waiting; the endpoint counts the wait and names the lab, never the user."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families
from session.conftest import User, wait_for
from session.institution import institution

from .prometheus import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the broker's tests create Unix users: run as root"),
]


def _scrape(port: int) -> tuple[str, dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return text, samples


def _queued(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> float:
    return sum(
        v for (n, labels), v in samples.items() if n == "calque_broker_requests" and ("state", "queued") in labels
    )


def test_the_broker_serves_its_queue_and_the_oldest_wait_on_its_metrics_port(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 1}) as broker:
        port = free_port()
        broker.config.update({"metrics_port": port, "queue": {"max_queued_per_user": 20, "aging": "10m"}})
        broker.start()
        alice, carol = make_user(), make_user()
        broker.anywhere(alice)  # the only slice
        _, before = _scrape(port)
        assert _queued(before) == 0 and before[("calque_broker_queue_aging_seconds", frozenset())] == 600
        waiter = broker.popen(carol, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait")
        try:
            assert wait_for(lambda: _queued(_scrape(port)[1]) == 1)
            text, first = _scrape(port)
            (wait_key,) = [k for k in first if k[0] == "calque_broker_queue_wait_seconds"]
            assert dict(wait_key[1])["lab"] == "default"
            assert carol.name not in text and alice.name not in text  # who waits is not on the port
            assert wait_for(lambda: _scrape(port)[1].get(wait_key, 0) >= first[wait_key] + 1)  # it grows
        finally:
            waiter.kill()
            waiter.wait(10)
        broker.stop()  # the endpoint closes with the broker (before its queue file: a scrape reads it)
        assert "metrics on http://127.0.0.1:" in broker.log() and "Traceback" not in broker.log()
        with pytest.raises(OSError):
            _scrape(port)
