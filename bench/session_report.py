"""``calque session report``: the registry's usage table vs. re-reading the audit log per call.

Fills a real registry (SQLite, the daemon's schema) with ``--sessions`` ended sessions of 500 users
over 90 days, writes the same sessions as an audit log (a checkout and an end line each), then times
one report over the last 7 days, for an admin (every user) and for one user:

* calque: ``calque.session.daemon.usage.usage_report`` (one indexed query on the usage table);
* baseline: what ``report`` did before, parse every audit line and sum per user and profile.

Prints the median of ``--repeat`` calls of each and the ratio (lower is better).

    .venv/bin/python bench/session_report.py [--sessions 150000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from calque.session.daemon.registry import Registry
from calque.session.daemon.schema import INSERT_USAGE
from calque.session.daemon.usage import usage_report

DAY = 86400.0


def _fill(reg: Registry, log: Path, n: int, now: float) -> None:
    rnd = random.Random(12)
    rows = []
    with log.open("w") as f:
        for i in range(n):
            uid = 1000 + rnd.randrange(500)
            start = now - rnd.uniform(0, 90 * DAY)
            end = start + rnd.uniform(60, 8 * 3600)
            profile = rnd.choice(["1g.5gb", "2g.10gb", "3g.20gb"])
            rows.append((f"s-{i:010x}", uid, f"u{uid}", "mig", profile, 0, f"MIG-{i % 56}", start, end, "checkin"))
            base = {"session": rows[-1][0], "uid": uid, "user": f"u{uid}", "profile": profile, "kind": "mig"}
            for event, at in (("checkout", start), ("checkin", end)):
                f.write(
                    json.dumps({**base, "event": event, "ts": datetime.fromtimestamp(at, timezone.utc).isoformat()})
                )
                f.write("\n")
    # The bench fills the table directly, in one transaction: 300k checkouts through the socket would take minutes.
    reg.transaction(lambda db: db.executemany(INSERT_USAGE, rows))


def _from_log(log: Path, since: datetime, until: datetime, uid: int | None) -> dict[tuple[str, str], float]:
    """The old report: every line parsed, checkouts matched to their ends, hours summed."""
    starts: dict[str, dict[str, object]] = {}
    ends: dict[str, datetime] = {}
    with log.open("rb") as f:
        for raw in f:
            e = json.loads(raw)
            if e["event"] == "checkout":
                starts[e["session"]] = e
            elif e["session"] not in ends:
                ends[e["session"]] = datetime.fromisoformat(e["ts"])
    acc: dict[tuple[str, str], float] = {}
    for sid, e in starts.items():
        if uid is not None and e["uid"] != uid:
            continue
        begin = datetime.fromisoformat(str(e["ts"]))
        lo, hi = max(begin, since), min(ends.get(sid, until), until)
        if hi > lo:
            key = (str(e["user"]), str(e["profile"]))
            acc[key] = acc.get(key, 0.0) + (hi - lo).total_seconds() / 3600
    return acc


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=150_000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="calque-report-bench-"))
    try:
        reg = Registry(d / "state/sessions.db")
        log = d / "audit.jsonl"
        now = time.time()
        _fill(reg, log, a.sessions, now)
        until = datetime.fromtimestamp(now, timezone.utc)
        since = datetime.fromtimestamp(now - 7 * DAY, timezone.utc)
        print(f"report over 7 of 90 days; {a.sessions} sessions ({2 * a.sessions} audit lines); median of {a.repeat}")
        print(f"{'who':8} {'calque ms':>10} {'baseline ms':>12} {'ratio':>7}")
        for who, uid in (("admin", None), ("one user", 1007)):
            got = {(r.user, r.profile): r.gpu_hours for r in usage_report(reg, since, until, uid).rows}
            want = _from_log(log, since, until, uid)
            if got.keys() != want.keys() or any(abs(got[k] - want[k]) > 0.01 for k in want):
                raise SystemExit(f"{who}: the registry's report differs from the audit log's")
            ours = _median_ms(lambda uid=uid: usage_report(reg, since, until, uid), a.repeat)
            theirs = _median_ms(lambda uid=uid: _from_log(log, since, until, uid), a.repeat)
            print(f"{who:8} {ours:10.2f} {theirs:12.1f} {ours / theirs:8.5f}x  ({len(got)} rows, same as the log's)")
        reg.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
