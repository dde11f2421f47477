"""calque.gpu.monitoring by real ``ansible-playbook`` runs on this machine (a local connection) into
temporary directories: check mode predicts and writes nothing, a run places the rules and the
dashboards as shipped, a second run changes nothing, and an edited file is put back."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.ansible import run_playbook

from .promql import DASHBOARDS, RULES

pytestmark = pytest.mark.slow
ROLE = [{"ansible.builtin.include_role": {"name": "calque.gpu.monitoring"}}]


def _vars(tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {
        "calque_monitoring_rules_dir": str(tmp_path / "etc/prometheus/rules.d"),
        "calque_monitoring_dashboards_dir": str(tmp_path / "grafana/dashboards/calque"),
        "calque_monitoring_owner": pwd.getpwuid(os.getuid()).pw_name,
        "calque_monitoring_group": grp.getgrgid(os.getgid()).gr_name,
        **more,
    }


def _placed(tmp_path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tmp_path)): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}


def test_check_mode_then_a_run_then_a_second_run_that_changes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    check = run_playbook(work, ROLE, check=True, diff=True, play_vars=_vars(out))
    assert check.rc == 0, check.stdout + check.stderr
    assert check.changed >= 4  # two directories, the rules, the dashboards
    assert _placed(out) == {}  # check mode wrote nothing

    first = run_playbook(work, ROLE, play_vars=_vars(out))
    assert first.rc == 0, first.stdout + first.stderr
    rules = out / "etc/prometheus/rules.d/calque-rules.yml"
    assert rules.read_bytes() == RULES.read_bytes()
    for d in DASHBOARDS:
        assert (out / "grafana/dashboards/calque" / d.name).read_bytes() == d.read_bytes()
    assert len(_placed(out)) == 1 + len(DASHBOARDS)
    assert oct(rules.stat().st_mode & 0o777) == "0o644"
    if shutil.which("promtool"):  # the role validated with it; the placed file is one Prometheus loads
        assert first.task("calque.gpu.monitoring : Monitoring | Look for promtool")["rc"] == 0
        subprocess.run(["promtool", "check", "rules", str(rules)], check=True, capture_output=True)

    second = run_playbook(work, ROLE, play_vars=_vars(out))
    assert second.rc == 0 and second.changed == 0, [r["task"] for r in second.results if r["result"].get("changed")]

    rules.write_text(rules.read_text().replace("for: 10m", "for: 99m"))  # an edit by hand is put back
    third = run_playbook(work, ROLE, diff=True, play_vars=_vars(out))
    assert third.rc == 0 and third.changed == 1
    assert rules.read_bytes() == RULES.read_bytes()


def test_empty_directories_place_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    run = run_playbook(
        work, ROLE, play_vars=_vars(out, calque_monitoring_rules_dir="", calque_monitoring_dashboards_dir="")
    )
    assert run.rc == 0 and run.changed == 0, run.stdout + run.stderr
    assert _placed(out) == {}


def test_a_relative_directory_is_refused_and_nothing_is_placed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    run = run_playbook(work, ROLE, play_vars=_vars(out, calque_monitoring_rules_dir="etc/prometheus"))
    assert run.rc != 0
    assert "must be absolute paths" in run.stdout, run.stdout
    assert _placed(out) == {}
