"""Run real ``ansible-playbook`` against the repo's collection and read its per-task results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COLLECTIONS = REPO / "collections"
BIN = Path(sys.executable).parent


@dataclass
class PlaybookRun:
    rc: int
    stdout: str
    stderr: str
    results: list[dict[str, Any]]  # one per task that ran on localhost, in order

    def task(self, name: str) -> dict[str, Any]:
        for r in self.results:
            if r["task"] == name:
                return r["result"]
        raise KeyError(f"no task named {name!r}; ran: {[r['task'] for r in self.results]}")

    @property
    def changed(self) -> int:
        return sum(1 for r in self.results if r["result"].get("changed"))


def run_playbook(
    tmp_path: Path,
    tasks: list[dict[str, Any]],
    *,
    check: bool = False,
    diff: bool = False,
    extra_env: dict[str, str] | None = None,
    play_vars: dict[str, Any] | None = None,
    module_defaults: dict[str, Any] | None = None,
) -> PlaybookRun:
    """Write a one-play playbook of ``tasks`` on localhost and run it with the JSON callback."""
    play = {
        "name": "test",
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable, **(play_vars or {})},
        "tasks": tasks,
    }
    if module_defaults:
        play["module_defaults"] = module_defaults
    book = tmp_path / "playbook.yml"
    book.write_text(yaml.safe_dump([play], sort_keys=False))
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": f"{COLLECTIONS}",
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
        "ANSIBLE_HOME": str(tmp_path / ".ansible"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / ".ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
        **(extra_env or {}),
    }
    cmd = [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(book)]
    if check:
        cmd.append("--check")
    if diff:
        cmd.append("--diff")
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=300)
    results: list[dict[str, Any]] = []
    try:
        doc = json.loads(proc.stdout)
        for p in doc.get("plays", []):
            for t in p.get("tasks", []):
                name = t["task"]["name"]
                for host_result in t.get("hosts", {}).values():
                    results.append({"task": name, "result": host_result})
    except json.JSONDecodeError:
        pass
    return PlaybookRun(proc.returncode, proc.stdout, proc.stderr, results)
