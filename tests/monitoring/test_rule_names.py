"""Every metric the shipped rules and dashboards query is one calque exports (or a rule records),
and promtool accepts the rules and passes their unit tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest
from calque.models.ledger import LabSpend
from calque.pool.worker.worker_metrics import Metrics
from calque.session.broker.broker_metrics import BrokerCollector
from calque.session.daemon.daemon_metrics import SessionCollector
from prometheus_client.core import Metric
from support.waits import HANG_S

from .promql import DASHBOARDS, RULES, all_queries, dashboard_queries, names, rules

PROMTOOL = shutil.which("promtool")
UNIT_TESTS = Path(__file__).resolve().parent / "promtool/calque-rules.test.yml"
# Queried before anything exports it: the lab ledger (issue 24 §3) exports it, per lab.
PENDING: set[str] = set()  # names a rule or panel may query before their exporter exists


def _exposed(families: Iterable[Metric]) -> set[str]:
    """The sample names a scrape of these families can carry."""
    out: set[str] = set()
    for f in families:
        if f.type == "counter":
            out |= {f"{f.name}_total", f"{f.name}_created"}
        elif f.type == "histogram":
            out |= {f"{f.name}_{s}" for s in ("bucket", "sum", "count", "created")}
        else:
            out.add(f.name)
    return out


def exported() -> set[str]:
    """What calque's exporters register: the session daemon's (idle reclaim on), the broker's, a pool worker's."""
    session = SessionCollector(slices=list, live=list, tally=None, idle_for=1800.0)
    spend = LabSpend(lab="lab-a", month="2026-12", gpu_hours=8.0, ec2_usd=16.0, unit="GPU-hours", limit=10.0,
                     used=0.8, state="notice")  # fmt: skip
    broker = BrokerCollector(live=list, aging=1800.0, budgets=lambda: [spend])
    worker = Metrics({"model": "m", "worker": "w"})
    return _exposed(session.collect()) | _exposed(broker.collect()) | _exposed(worker.registry.collect())


def test_the_name_reader_finds_metrics_and_nothing_else() -> None:
    expr = (
        'sum by (model, le) (rate(calque_pool_claim_seconds_bucket{model=~"$model", le!="1e3"}[$__rate_interval]))'
        " / ignoring (kind) group_left calque:pool_backlog offset 5m > bool 1e3"
        ' and on (instance) label_replace(up == 1, "host", "$1", "worker", "([^:]+):.*")'
    )
    assert names(expr) == {"calque_pool_claim_seconds_bucket", "calque:pool_backlog", "up"}


def test_every_metric_a_rule_or_a_dashboard_queries_is_exported_by_calque() -> None:
    have = exported()
    recorded = {r["record"] for r in rules() if "record" in r}
    missing: dict[str, set[str]] = {}
    for where, expr in all_queries():
        for name in names(expr) - have - recorded - PENDING:
            missing.setdefault(name, set()).add(where)
    assert missing == {}, f"queried but exported by nothing in calque: {missing}"
    # and the pending names are really queried (a rule or panel for them, waiting on their exporter)
    queried = {n for _, e in all_queries() for n in names(e)}
    assert queried >= PENDING


def test_recording_rules_use_only_earlier_records_and_every_record_is_used() -> None:
    seen: set[str] = set()
    used = {n for _, e in all_queries() for n in names(e)}
    for rule in rules():
        assert names(rule["expr"]) & {r["record"] for r in rules() if "record" in r} <= seen, rule
        if "record" in rule:
            assert rule["record"].startswith("calque:"), rule["record"]
            assert rule["record"] in used, f"{rule['record']} is recorded but no rule or dashboard reads it"
            seen.add(rule["record"])


def test_the_dashboards_are_grafana_json_with_a_datasource_variable_and_unique_ids() -> None:
    assert {p.stem for p in DASHBOARDS} == {"calque-pools", "calque-sessions", "calque-labs"}
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        assert doc["uid"] == path.stem and doc["schemaVersion"] >= 36
        variables = {v["name"]: v for v in doc["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)), path.name
        for panel in doc["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}", (path.name, panel["title"])
            assert panel["targets"], (path.name, panel["title"])
        assert list(dashboard_queries(path))


def test_every_alert_has_a_promtool_unit_test() -> None:
    text = UNIT_TESTS.read_text()
    for rule in rules():
        if "alert" in rule:
            assert f"alertname: {rule['alert']}\n" in text, f"{rule['alert']} has no case in {UNIT_TESTS.name}"


needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus; scripts/test installs it)"
)


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    assert PROMTOOL is not None
    res = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=HANG_S)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(list(rules()))} rules found" in res.stdout


@needs_promtool
def test_promtool_unit_tests_of_the_rules_pass() -> None:
    assert PROMTOOL is not None
    res = subprocess.run([PROMTOOL, "test", "rules", str(UNIT_TESTS)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


def test_a_pool_workers_metrics_are_thread_safe_to_clear() -> None:
    # the backlog sampler clears its gauge on a failed reading while a scrape may be rendering
    m = Metrics({"model": "m", "worker": "w"})
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            list(m.registry.collect())

    t = threading.Thread(target=scrape)
    t.start()
    for i in range(200):
        m.set("calque_pool_queue_messages", i, state="visible")
        m.clear("calque_pool_queue_messages")
    stop.set()
    t.join(5)
    assert m.get("calque_pool_queue_messages", state="visible") == 0
