"""The MPS systemd units name calque by absolute path (systemd's PATH has no venv)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from calque.cli.main import run
from calque.errors import UsageError
from calque.gpu.mps_units import SERVICE, TARGET, mps_units


def _exec_lines(unit: str) -> list[str]:
    return [line for line in unit.splitlines() if line.startswith(("ExecStart=", "ExecStop="))]


def test_units_run_the_calque_of_the_given_venv_not_env_calque() -> None:
    units = mps_units("/opt/calque/venv/bin/calque").units
    lines = _exec_lines(units[SERVICE])
    assert [line.split()[0] for line in lines] == [
        "ExecStart=/opt/calque/venv/bin/calque",
        "ExecStop=/opt/calque/venv/bin/calque",
    ]
    assert "/usr/bin/env" not in units[SERVICE]


def test_default_calque_is_the_one_beside_the_running_interpreter() -> None:
    expected = Path(sys.executable).parent / "calque"
    lines = _exec_lines(mps_units().units[SERVICE])
    assert lines[0].startswith(f"ExecStart={expected} gpu mps start --gpus %i")
    assert expected.exists(), "the test venv's calque must exist for the default to be useful"


def test_daemon_units_hang_off_the_target_that_orders_them_before_sessions() -> None:
    units = mps_units("/x/bin/calque").units
    service, target = units[SERVICE], units[TARGET]
    assert "PartOf=calque-mps.target" in service
    assert "WantedBy=calque-mps.target" in service
    assert "Before=calque-session.service" in target
    assert "After=calque-gpu.service" in target
    assert "WantedBy=multi-user.target" in target


def test_relative_calque_path_is_refused() -> None:
    with pytest.raises(UsageError, match="not absolute"):
        mps_units("bin/calque")


def test_cli_prints_both_units_and_json_for_roles(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["gpu", "mps", "unit", "--calque", "/opt/calque/venv/bin/calque"]) == 0
    out = capsys.readouterr().out
    assert "# ==> /etc/systemd/system/calque-mps@.service" in out
    assert "# ==> /etc/systemd/system/calque-mps.target" in out
    assert run(["gpu", "mps", "unit", "--calque", "/opt/calque/venv/bin/calque", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["calque"] == "/opt/calque/venv/bin/calque"
    assert set(doc["units"]) == {SERVICE, TARGET}
