"""Where the suite's time goes: spans of named work (a playbook run, a booted estate's phase, a fixture's
set-up) recorded by whichever process does the work, for the time report (``support/time_report.py``).

Each process appends its spans as JSON lines to a file of its own under ``build/test-logs/spans/`` (the
xdist workers, and the controller), so nothing is lost when a worker dies and no process waits on
another; the controller reads them all when the run ends. A span says what ran, on which worker, for
which test, when it started and how long it took.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPANS_DIR = REPO / "build" / "test-logs" / "spans"
CALLBACKS = Path(__file__).resolve().parent / "callback_plugins"  # calque_test_timer: each playbook run's span
_lock = threading.Lock()  # molecule scenarios record from threads of their own


def worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def current_test() -> str:
    """The test this process is running (pytest sets the variable per phase: "nodeid (call)")."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def record(kind: str, what: str, start: float, seconds: float, **extra: object) -> None:
    """One span: ``kind`` groups it in the report (playbook, estate, molecule, fixture), ``what`` names it."""
    line = {
        "kind": kind,
        "what": what,
        "worker": worker(),
        "test": current_test(),
        "start": round(start, 3),
        "seconds": round(seconds, 3),
        **extra,
    }
    folder = os.environ.get("CALQUE_TEST_SPANS")
    if not folder:  # outside the suite (python -m tests.hosts by hand): nothing to report to
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    with _lock, (Path(folder) / f"{worker()}-{os.getpid()}.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")


@contextmanager
def span(kind: str, what: str, **extra: object) -> Iterator[None]:
    """Time the block as one span (recorded whether it ends well or raises)."""
    start, t0 = time.time(), time.monotonic()
    try:
        yield
    finally:
        record(kind, what, start, time.monotonic() - t0, **extra)


def enable_in_environment() -> None:
    """Spans from this process and every process it starts: the folder, and the playbook callback."""
    os.environ["CALQUE_TEST_SPANS"] = str(SPANS_DIR)
    paths = [str(CALLBACKS), *filter(None, os.environ.get("ANSIBLE_CALLBACK_PLUGINS", "").split(os.pathsep))]
    os.environ["ANSIBLE_CALLBACK_PLUGINS"] = os.pathsep.join(dict.fromkeys(paths))
    enabled = [*filter(None, os.environ.get("ANSIBLE_CALLBACKS_ENABLED", "").split(",")), "calque_test_timer"]
    os.environ["ANSIBLE_CALLBACKS_ENABLED"] = ",".join(dict.fromkeys(enabled))


def read_spans(folder: Path = SPANS_DIR) -> list[dict[str, object]]:
    spans: list[dict[str, object]] = []
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        for line in path.read_text().splitlines():
            try:
                spans.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a killed worker: the rest still counts
    return spans
