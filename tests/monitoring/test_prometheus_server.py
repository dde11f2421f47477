"""A real Prometheus server scrapes a real session daemon and a real pool worker, evaluates the
shipped rules, and fires CalqueSliceIdle for the idle slice a real second user holds; every
dashboard query is one that server accepts. Scraping a real broker, it fires
CalqueSessionsWaitingTooLong for a real user waiting past the aging bound."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.models import QueueSettings
from pool.conftest import Pool
from session.conftest import Host, User
from session.institution import institution

from .prometheus import PROMETHEUS, free_port, prometheus
from .promql import DASHBOARDS, dashboard_queries

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="the prometheus server is not installed (Debian: apt-get install prometheus; scripts/test installs it)",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="the session daemon's tests create Unix users: run as root"),
]

IDLE_FOR_S = 40.0  # the alert fires past half of it (20 s idle); the slice is reclaimed at 40 s


def _value(result: list[dict[str, object]]) -> float:
    (sample,) = result
    return float(sample["value"][1])  # type: ignore[index]


def test_prometheus_scrapes_a_daemon_and_a_worker_and_fires_the_idle_alert(
    host: Host, make_user: Callable[..., User], make_pool: Callable[..., Pool], tmp_path: Path
) -> None:
    session_port, worker_port = free_port(), free_port()
    host.start(metrics_port=session_port, idle={"below": "5%", "for": f"{IDLE_FOR_S:g}s", "warn": "5s"})
    pool = make_pool(pool="lab-a/steady", metrics_port=worker_port, backlog_poll_s=1, backlog_target=3)
    named = PoolQueue(client("sqs"), pool.model, pool="lab-a/steady")  # a lab's pool: its queue from the name
    named.ensure(QueueSettings(visibility_timeout=30, receive_wait=1, max_receive_count=10, encryption=False))
    worker = pool.start()
    worker.wait_log("metrics on http://127.0.0.1:")
    with prometheus(tmp_path, {"calque-session": session_port, "calque-pool": worker_port}) as prom:
        up = prom.wait('count(up{job=~"calque-.*"} == 1) == 2', "both targets scraped")
        assert _value(up) == 2
        alice = make_user()
        out = host.cli(alice, "session", "checkout", "--ttl", "1h", "--json", check=True).stdout
        held = json.loads(out)
        checked_out = time.monotonic()
        # Nothing of Alice runs on the slice: idle from the checkout. Not before half the policy's `for` ...
        firing = 'ALERTS{alertname="CalqueSliceIdle", alertstate="firing"}'
        assert prom.query(firing) == []
        (alert,) = prom.wait(firing, "the idle alert firing")
        fired_after = time.monotonic() - checked_out
        assert fired_after >= IDLE_FOR_S / 2 - 1, fired_after
        labels = alert["metric"]
        assert labels["slice"] == held["slice_id"] and labels["severity"] == "info"
        assert labels["job"] == "calque-session" and labels["profile"] == "1g.5gb"
        assert "user" not in labels and alice.name not in json.dumps(labels)  # the holder is not exported
        # ... and the pool's recorded series from the worker's own metrics: one instance, its target, a backlog
        model = '{model="org/steady"}'
        assert _value(prom.wait(f"calque:pool_instances_serving{model}", "instances serving")) == 1
        assert _value(prom.wait(f"calque:pool_backlog_target{model}", "the backlog target")) == 3
        assert _value(prom.wait(f"calque:pool_backlog{model}", "the backlog")) == 0
        assert prom.query('ALERTS{alertname="CalquePoolBacklogAboveTarget"}') == []
        # the labs dashboard reads a named pool's lab from its pool label
        by_lab = prom.query('sum by (lab) (label_replace(calque_pool_up, "lab", "$1", "pool", "([^/]+)/.*"))')
        assert [(r["metric"]["lab"], float(r["value"][1])) for r in by_lab] == [("lab-a", 1.0)]
        # Every panel's and variable's query parses and evaluates on this server.
        for path in DASHBOARDS:
            for expr in dashboard_queries(path):
                text = expr.replace("$__rate_interval", "1m")
                for var in ("$instance", "$model", "$lab"):
                    text = text.replace(var, ".*")
                prom.query(text)


def test_prometheus_fires_sessions_waiting_too_long_past_the_brokers_aging_bound(
    make_user: Callable[..., User], tmp_path: Path
) -> None:
    aging_s = 8.0
    with institution(make_user, {"hostA": 1}) as broker:
        port = free_port()
        broker.config.update({"metrics_port": port, "queue": {"max_queued_per_user": 20, "aging": f"{aging_s:g}s"}})
        broker.start()
        alice, carol = make_user(), make_user()
        broker.anywhere(alice)  # the only slice
        with prometheus(tmp_path, {"calque-broker": port}) as prom:
            prom.wait('up{job="calque-broker"} == 1', "the broker scraped")
            waiter = broker.popen(carol, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait")
            try:
                queued = time.monotonic()
                firing = 'ALERTS{alertname="CalqueSessionsWaitingTooLong", alertstate="firing"}'
                (alert,) = prom.wait(firing, "the waiting alert firing")
                assert time.monotonic() - queued >= aging_s - 1
                labels = alert["metric"]
                assert labels["lab"] == "default" and labels["severity"] == "warning"
                assert carol.name not in json.dumps(labels)
                assert _value(prom.query('calque:broker_queued:sum_by_lab{lab="default"}')) == 1
            finally:
                waiter.kill()
                waiter.wait(10)
