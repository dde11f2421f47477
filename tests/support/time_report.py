"""The suite's own time report, printed at the end of every run (and kept in build/test-logs/).

What it adds up, in the controller process:

- every test's set-up, call and tear-down (pytest's reports, which xdist carries from its workers), by
  tier (``tests/<dir>``), by unit (what one worker runs together: tests/conftest.py's ``_unit``) and
  by worker;
- the spans the workers record (``support/timings.py``): each ``ansible-playbook`` run, the booted
  estate's phases, each molecule scenario, and every fixture's set-up summed by name.

A contributor reads where the minutes went without a second run: the ten longest units, the booted
tier, the playbook tier, the fixtures that cost most, and how busy each worker was.
"""

from __future__ import annotations

import json
import resource
import time
from collections import defaultdict
from collections.abc import Callable, Generator
from typing import Any

import pytest

from .timings import REPO, SPANS_DIR, read_spans, record

REPORT_TXT = REPO / "build" / "test-logs" / "time-report.txt"
REPORT_JSON = REPO / "build" / "test-logs" / "time-report.json"
FIXTURE_SPAN_S = 1.0  # a fixture set-up this long is also kept as a span of its own


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _fmt(seconds: float) -> str:
    return f"{seconds:7.1f} s"


class FixtureClock:
    """In each process that sets fixtures up: their set-up time summed by name, written when it ends."""

    def __init__(self) -> None:
        self.totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        self.cpu: dict[str, float] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any]) -> Generator[None, Any, Any]:
        start, t0 = time.time(), time.monotonic()
        try:
            return (yield)
        finally:
            took = time.monotonic() - t0
            total = self.totals[fixturedef.argname]
            total[0] += 1
            total[1] += took
            if took >= FIXTURE_SPAN_S:
                record("fixture", fixturedef.argname, start, took, scope=fixturedef.scope)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, Any, Any]:
        """The CPU a test's own processes used: this worker and the children it waited for (the booted
        hosts are counted apart, from their cgroups: ``host-cpu``)."""
        before = _cpu()
        try:
            return (yield)
        finally:
            self.cpu[item.nodeid] = _cpu() - before

    def pytest_sessionfinish(self) -> None:
        for name, (count, seconds) in self.totals.items():
            record("fixture-total", name, time.time(), seconds, count=count)
        for nodeid, seconds in self.cpu.items():
            record("test-cpu", nodeid, time.time(), seconds)


class TimeReport:
    """In the controller: the tests' phases as they are reported, then the report at the end."""

    def __init__(self, unit: Callable[[str], str]) -> None:
        # Made at configure time, before any worker starts: spans of an earlier run would count as this run's.
        for old in SPANS_DIR.glob("*.jsonl") if SPANS_DIR.is_dir() else []:
            old.unlink()
        self.unit = unit
        self.started = time.time()
        self.phases: dict[str, dict[str, float]] = defaultdict(dict)
        self.workers: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.phases[report.nodeid][report.when] = report.duration
        node = getattr(report, "node", None)
        self.workers[report.nodeid] = node.gateway.id if node is not None else "main"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        lines, doc = self.report(read_spans(), time.time() - self.started)
        REPORT_TXT.parent.mkdir(parents=True, exist_ok=True)
        REPORT_TXT.write_text("\n".join(lines) + "\n")
        REPORT_JSON.write_text(json.dumps(doc, indent=1) + "\n")
        terminalreporter.write_sep("=", f"time report ({REPORT_TXT.relative_to(REPO)})")
        for line in lines:
            terminalreporter.write_line(line)

    def report(self, spans: list[dict[str, Any]], wall: float) -> tuple[list[str], dict[str, Any]]:
        per_test = {nodeid: sum(p.values()) for nodeid, p in self.phases.items()}
        phase_sum = {w: sum(p.get(w, 0.0) for p in self.phases.values()) for w in ("setup", "call", "teardown")}
        tiers: dict[str, float] = defaultdict(float)
        units: dict[str, float] = defaultdict(float)
        busy: dict[str, float] = defaultdict(float)
        for nodeid, seconds in per_test.items():
            tiers["/".join(nodeid.split("/")[:2]) if nodeid.startswith("tests/") else nodeid] += seconds
            units[self.unit(nodeid)] += seconds
            busy[self.workers.get(nodeid, "main")] += seconds
        by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for s in spans:
            by_kind[str(s["kind"])].append(s)

        out = [
            f"wall {wall:.0f} s; {len(per_test)} tests, {sum(per_test.values()):.0f} s of test time "
            f"(set-up {phase_sum['setup']:.0f}, call {phase_sum['call']:.0f}, tear-down {phase_sum['teardown']:.0f})",
            "workers (test time each): " + ", ".join(f"{w} {s:.0f} s" for w, s in sorted(busy.items())),
            "",
            "by tier:",
            *(f"  {_fmt(s)}  {t}" for t, s in sorted(tiers.items(), key=lambda kv: -kv[1])),
            "",
            "the ten longest units (what one worker runs together):",
            *(f"  {_fmt(s)}  {u}" for u, s in sorted(units.items(), key=lambda kv: -kv[1])[:10]),
            "",
            "the ten longest tests:",
            *(f"  {_fmt(s)}  {t}" for t, s in sorted(per_test.items(), key=lambda kv: -kv[1])[:10]),
        ]

        booted = sorted(by_kind["estate"] + by_kind["hosts"] + by_kind["molecule"], key=lambda s: s["start"])
        out += ["", f"booted tier ({sum(s for t, s in tiers.items() if t == 'tests/hosts'):.0f} s of test time):"]
        out += [f"  {_fmt(s['seconds'])}  {s['kind']}: {s['what']}  [{s['worker']}]" for s in booted]

        books = by_kind["playbook"]
        per_book: dict[str, list[float]] = defaultdict(list)
        per_file: dict[str, float] = defaultdict(float)
        per_task: dict[str, float] = defaultdict(float)
        per_task_runs: dict[str, list[float]] = defaultdict(list)
        for s in books:
            per_book[str(s["what"])].append(float(s["seconds"]))
            for task, seconds in dict(s.get("task_seconds") or {}).items():
                per_task[f"{s['what']}: {task}"] += float(seconds)
                per_task_runs[f"{s['what']}: {task}"].append(float(seconds))
            per_file[str(s["test"]).split("::", 1)[0] or "(outside a test)"] += float(s["seconds"])
        out += [
            "",
            f"playbook tier: {len(books)} ansible-playbook runs, {sum(float(s['seconds']) for s in books):.0f} s",
            *(
                f"  {_fmt(sum(v))}  {len(v):3d} x {name} (median {sorted(v)[len(v) // 2]:.1f} s)"
                for name, v in sorted(per_book.items(), key=lambda kv: -sum(kv[1]))[:10]
            ),
            "  by test file:",
            *(f"  {_fmt(s)}  {f}" for f, s in sorted(per_file.items(), key=lambda kv: -kv[1])[:10]),
            "  by task (every run of every playbook, all hosts together):",
            *(
                f"  {_fmt(s)}  {len(per_task_runs[t]):3d} x {t}"
                for t, s in sorted(per_task.items(), key=lambda kv: -kv[1])[:12]
            ),
        ]

        cpu_tiers: dict[str, float] = defaultdict(float)
        cpu_units: dict[str, float] = defaultdict(float)
        for s in by_kind["test-cpu"]:
            nodeid = str(s["what"])
            cpu_tiers["/".join(nodeid.split("/")[:2])] += float(s["seconds"])
            cpu_units[self.unit(nodeid)] += float(s["seconds"])
        hosts_cpu: dict[str, float] = defaultdict(float)
        for s in by_kind["host-cpu"]:  # cth-<checkout>-<run>-<host>: summed by run (e2e, mol-<scenario>, ...)
            run = "-".join(str(s["what"]).split("-")[2:-1]) or str(s["what"])
            hosts_cpu[run] += float(s["seconds"])
        machine_cpu = sum(cpu_tiers.values()) + sum(hosts_cpu.values())
        out += [
            "",
            f"CPU: {machine_cpu:.0f} s in all ({machine_cpu / max(wall, 1):.2f} cores busy on average): the tests' own "
            f"processes {sum(cpu_tiers.values()):.0f} s, the booted hosts {sum(hosts_cpu.values()):.0f} s",
            "  by tier (the test's processes):",
            *(f"  {_fmt(s)}  {t}" for t, s in sorted(cpu_tiers.items(), key=lambda kv: -kv[1])),
            "  the ten costliest units:",
            *(f"  {_fmt(s)}  {u}" for u, s in sorted(cpu_units.items(), key=lambda kv: -kv[1])[:10]),
            "  booted hosts, by run:",
            *(f"  {_fmt(s)}  {r}" for r, s in sorted(hosts_cpu.items(), key=lambda kv: -kv[1])),
        ]

        fixtures: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for s in by_kind["fixture-total"]:
            fixtures[str(s["what"])][0] += int(s.get("count", 0))
            fixtures[str(s["what"])][1] += float(s["seconds"])
        out += [
            "",
            "fixtures (set-up time summed over every process):",
            *(
                f"  {_fmt(v[1])}  {name} ({int(v[0])} set-ups)"
                for name, v in sorted(fixtures.items(), key=lambda kv: -kv[1][1])[:12]
            ),
        ]
        doc = {
            "wall_s": round(wall, 1),
            "tests": {n: {**p, "worker": self.workers.get(n, "main")} for n, p in self.phases.items()},
            "spans": spans,
        }
        return out, doc
