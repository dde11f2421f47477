"""The checkout's lab-budget gate: what a budgeted lab's month costs to add up at every checkout.

Fills a real registry (SQLite, the daemon's schema) of a simulated A100-40GB host with ``--sessions``
ended sessions of 500 users over 90 days (a third of them this month, in the gate's window), then
times the month of one budgeted lab:

* calque: ``calque.session.daemon.daemon_ledger.spend_of`` (the month before this hour summed once an hour, the
  last hour's ends through ``usage_ended_at`` and the live sessions at every call; the first call is
  among those the median is taken of);
* baseline: every session of the month as a priced usage event, summed (``host_events`` + ``lab_spend``),
  what ``calque report`` does for a window.

Prints the median of ``--repeat`` calls of each and the ratio (lower is better).

    .venv/bin/python bench/ledger_gate.py [--sessions 150000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from calque.gpu.sim import SimGpu
from calque.ledger.budgets import lab_spend, month_start
from calque.models.institution import Lab, LabBudget
from calque.session.daemon.daemon_ledger import host_events, spend_of
from calque.session.daemon.host import Host
from calque.session.daemon.schema import INSERT_USAGE
from calque.session.session_config import load_config
from calque.timefmt import utc_moment

DAY = 86400.0


def _host(d: Path, n: int, now: float) -> Host:
    sim = SimGpu.create(d / "gpus.json", ["A100-40GB"], mig=True, root=d / "root")
    sim.create_instances(0, ["1g.5gb"] * 7)
    cfg = {
        "version": 1,
        "socket": str(d / "s.sock"),
        "db": str(d / "state/sessions.db"),
        "audit_log": str(d / "a.jsonl"),
    }
    cfg |= {"gpu_backend": "sim", "sim_state": str(sim.state_path), "institution": str(d / "institution.yaml")}
    (d / "session.yaml").write_text(yaml.safe_dump(cfg))
    host = Host.build(load_config(d / "session.yaml"))
    rnd = random.Random(12)
    rows = []
    for i in range(n):
        uid = 1000 + rnd.randrange(500)
        start = now - rnd.uniform(0, 90 * DAY)
        end = start + rnd.uniform(60, 8 * 3600)
        rows.append((f"s-{i:010x}", uid, f"u{uid}", "mig", "1g.5gb", 0, f"MIG-{i % 7}", start, end, "checkin"))
    for k in range(0, len(rows), 5000):
        chunk = rows[k : k + 5000]
        host.registry._write(lambda db, c=chunk: db.executemany(INSERT_USAGE, c))
    return host


def _median(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=150_000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="calque-bench-ledger-"))
    now = time.time()
    host = _host(d, a.sessions, now)
    lab = Lab(name="lab-a", groups=["root"], budget=LabBudget(gpu_hours=100))
    start = month_start(utc_moment(now)).timestamp()
    try:
        ours = _median(lambda: spend_of(host, lab, now), a.repeat)
        base = _median(lambda: lab_spend(lab, host_events(host, start, now), utc_moment(now)), a.repeat)
    finally:
        host.close()
        shutil.rmtree(d, ignore_errors=True)
    print(f"{a.sessions} sessions over 90 days, the month of one lab, median of {a.repeat}")
    print(f"calque (hourly sum + last hour):   {ours * 1000:9.1f} ms")
    print(f"baseline (every event, summed):   {base * 1000:9.1f} ms")
    print(f"ratio:                            {ours / base:9.3f}")


if __name__ == "__main__":
    main()
