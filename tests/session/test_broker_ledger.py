"""The institution's ledger through the broker: every host's usage in one report (each user sees only
their own), a host that is down reported from its last answer and marked stale (never dropped), and
each lab mailed once at its notice share and once at 100 % of its budget, through a real SMTP sink."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from .conftest import LAB_A, LAB_B, User, wait_for
from .institution import Broker, _user_python, free_port, make_host
from .test_broker import _Sink


def _report(broker: Broker, user: User | None, by: str) -> dict[str, Any]:
    res = broker.cli(user, "report", "--institution", "--by", by, "--since", "1d", "--json")
    assert res.returncode == 0, res.stderr
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def test_the_institution_report_keeps_a_down_host_as_stale_and_labs_are_mailed_at_their_budget(
    make_user: Callable[..., User],
) -> None:
    from aiosmtpd.controller import Controller

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        smtp_port = probe.getsockname()[1]
    sink = _Sink()
    smtp = Controller(sink, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    root = Path(tempfile.mkdtemp(prefix="calque-ledger-", dir="/tmp"))
    root.chmod(0o755)
    alice, bob = make_user([LAB_A]), make_user([LAB_B])
    port = free_port()
    hosts = {name: make_host(root, name, 2, alice, port) for name in ("hostA", "hostB")}
    python, env = _user_python(alice)
    broker = Broker(dir=root / "broker", hosts=hosts, python=python, env=env, port=port)
    broker.dir.mkdir(mode=0o755)
    labs = [
        # lab-a: told early (a notice at 0.01 % of 1 GPU-h, 0.36 GPU-s) and far from its end
        {"name": "lab-a", "groups": [LAB_A], "budget": {"gpu_hours": 1.0, "notify_at": 0.0001}},
        # lab-b: 0.0001 GPU-h (0.36 GPU-s) is spent in under 3 s on a 1/7 slice
        {"name": "lab-b", "groups": [LAB_B], "budget": {"gpu_hours": 0.0001, "raised_by": "rc@example.edu"}},
    ]
    broker.write_institution(labs=labs)
    inst = broker.dir / "institution.yaml"
    inst.chmod(0o644)
    try:
        for h in hosts.values():
            h.start(institution=str(inst))
        for h, u in ((hosts["hostA"], alice), (hosts["hostB"], alice), (hosts["hostB"], bob)):
            assert h.cli(u, "session", "checkout", "--json").returncode == 0
        time.sleep(4.0)
        for h, u in ((hosts["hostA"], alice), (hosts["hostB"], alice), (hosts["hostB"], bob)):
            assert h.cli(u, "session", "checkin").returncode == 0
        broker.config["mail"] = {
            "relay": "127.0.0.1",
            "port": smtp_port,
            "domain": "example.edu",
            "labs": {"lab-a": "lab-a@example.edu", "lab-b": "lab-b@example.edu"},
        }
        broker.config["ledger_every"] = 1.0
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            metrics_port = probe.getsockname()[1]
        broker.config["metrics_port"] = metrics_port
        broker.start()

        fresh = _report(broker, None, "lab")
        assert {(s["name"], s["stale"]) for s in fresh["sources"]} == {("hostA", False), ("hostB", False)}
        rows = {r["key"]: r for r in fresh["rows"]}
        assert rows["lab-a"]["events"] == 2 and rows["lab-b"]["events"] == 1
        assert rows["lab-a"]["gpu_hours"] > rows["lab-b"]["gpu_hours"] > 0
        assert not any(r["stale"] for r in fresh["rows"])
        mine = _report(broker, bob, "user")
        assert [r["key"] for r in mine["rows"]] == [bob.name]  # a user sees their own usage only

        assert wait_for(lambda: len(sink.messages) >= 2), [m["Subject"] for m in sink.messages]
        by_to = {m["To"]: m["Subject"] for m in sink.messages}
        assert by_to["lab-a@example.edu"].startswith("[calque] lab lab-a has used 0% of its budget")
        assert by_to["lab-b@example.edu"].startswith("[calque] lab lab-b has spent its budget")
        over = next(m for m in sink.messages if m["To"] == "lab-b@example.edu")
        assert "rc@example.edu" in over.get_payload()
        # the same round's month per lab on the broker's metrics endpoint (CalqueLabNearBudget/OverBudget)
        ratio = _budget_ratios(metrics_port)
        assert ratio["lab-b"] >= 1.0 and 0.0 < ratio["lab-a"] < 0.8, ratio
        time.sleep(2.5)  # two more rounds: each state is mailed once a month
        assert len(sink.messages) == 2, [m["Subject"] for m in sink.messages]
        # bob spent lab-b's budget on hostB; hostA, where lab-b used nothing, refuses him too: the broker
        # tells each host what the labs used on the others, and its checkout gate adds it
        refused = hosts["hostA"].cli(bob, "session", "checkout")
        assert refused.returncode == 4 and "lab lab-b has used" in refused.stderr, refused.stderr
        assert hosts["hostA"].cli(alice, "session", "checkout", "--json").returncode == 0  # lab-a is under
        status = hosts["hostA"].cli(bob, "budget", "status")  # what hostA's gate sees, lab-b's use on hostB in it
        assert status.returncode == 0 and "over" in status.stdout, status.stdout

        hosts["hostB"].stop()  # down: its usage is reported from its last answer, marked stale
        stale = _report(broker, None, "lab")
        assert {(s["name"], s["stale"]) for s in stale["sources"]} == {("hostA", False), ("hostB", True)}
        srows = {r["key"]: r for r in stale["rows"]}
        assert srows["lab-b"]["stale"] and srows["lab-b"]["gpu_hours"] == rows["lab-b"]["gpu_hours"]
        assert srows["lab-a"]["events"] == 3 and srows["lab-a"]["stale"]  # hostA's two (one live) and hostB's
        human = broker.cli(None, "report", "--institution", "--since", "1d")
        assert human.returncode == 0 and "stale: hostB did not answer" in human.stdout, human.stdout
        own = _report(broker, bob, "user")
        assert [(r["key"], r["stale"]) for r in own["rows"]] == [(bob.name, True)]
    finally:
        broker.stop()
        for h in hosts.values():
            h.stop()
        smtp.stop()
        shutil.rmtree(root, ignore_errors=True)


def _budget_ratios(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        s.labels["lab"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "calque_lab_budget_used_ratio"
    }


def test_a_lab_budget_in_institution_yaml_is_checked(tmp_path: Path) -> None:
    from calque.models.institution import Institution
    from pydantic import ValidationError

    doc = {"version": 1, "labs": [{"name": "x", "groups": ["g"], "budget": {"gpu_hours": 1, "usd": 2}}]}
    try:
        Institution.model_validate(doc)
    except ValidationError as exc:
        assert "give exactly one" in str(exc)
    else:
        raise AssertionError("a budget in both units was accepted")
    ok = Institution.model_validate(yaml.safe_load("version: 1\nlabs: [{name: x, groups: [g], budget: {usd: 50}}]"))
    assert ok.labs[0].budget is not None and ok.labs[0].budget.unit == "USD"
    assert ok.lab_of({"other", "g"}) is ok.labs[0] and ok.lab_of({"other"}) is None


def test_a_host_that_never_answered_is_listed_stale_with_nothing(tmp_path: Path) -> None:
    from calque.ledger.report import build_report, render_table
    from calque.session.broker.broker_ledger import BrokerLedger
    from calque.session.broker.local import LocalHost
    from calque.session.broker.store import Store

    state = tmp_path / "state"
    store = Store(state / "broker.db")
    try:
        links = {"ghost": LocalHost("ghost", tmp_path / "nothing-listens.sock", timeout=1.0)}
        (h,) = BrokerLedger(store, links, [], None).collect("1d")
        assert (h.host, h.stale, h.events) == ("ghost", True, [])
        r = build_report("lab", h.since, h.until, [h])
        assert [(s.name, s.stale) for s in r.sources] == [("ghost", True)]
        assert "stale: ghost did not answer" in render_table(r)
    finally:
        store.close()
