"""An ansible callback for the suite's time report: every ansible-playbook run a test starts (directly,
through molecule, through the sandbox) appends one span to ``$CALQUE_TEST_SPANS`` (support/timings.py).

tests/conftest.py puts this folder on ``ANSIBLE_CALLBACK_PLUGINS`` and enables the callback for the
processes it starts; outside the suite (no ``CALQUE_TEST_SPANS``) it does nothing. The span is the
process's whole life, start-up included (ansible's imports are much of a short run's cost): it is
measured from the process's start time in /proc.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: calque_test_timer
type: aggregate
short_description: records each playbook run's wall time for calque's test time report
description: [Appends one JSON line per ansible-playbook run to $CALQUE_TEST_SPANS/<worker>-<pid>.jsonl.]
"""


def _process_age() -> float:
    """Seconds since this process started (field 22 of /proc/self/stat, in clock ticks since boot)."""
    try:
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        return float(Path("/proc/uptime").read_text().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return 0.0


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "calque_test_timer"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._book = "?"
        self._tasks = 0
        self._task: tuple[str, float] | None = None  # the task running now (name, monotonic start)
        self._task_seconds: dict[str, float] = {}  # each task's time, all hosts together

    def _close_task(self) -> None:
        if self._task is not None:
            name, t0 = self._task
            self._task_seconds[name] = self._task_seconds.get(name, 0.0) + time.monotonic() - t0
            self._task = None

    def v2_playbook_on_start(self, playbook: Any) -> None:
        self._book = os.path.basename(getattr(playbook, "_file_name", "?") or "?")

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._close_task()
        self._task = (task.get_name(), time.monotonic())
        self._tasks += 1
        if self._tasks == 1 and self._book == "playbook.yml":  # a test's one-play book: name it by its module
            self._book = f"playbook.yml ({task.action})"

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._close_task()
        folder = os.environ.get("CALQUE_TEST_SPANS")
        if not folder:
            return
        seconds = _process_age()
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        line = {
            "kind": "playbook",
            "what": self._book,
            "worker": worker,
            "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0],
            "start": round(time.time() - seconds, 3),
            "seconds": round(seconds, 3),
            "tasks": self._tasks,
            "hosts": len(getattr(stats, "processed", {}) or {}),
            "task_seconds": {k: round(v, 3) for k, v in self._task_seconds.items()},
        }
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{worker}-{os.getpid()}.jsonl"), "a") as out:
            out.write(json.dumps(line) + "\n")
