"""The built wheel carries what hosts need besides code: catalogs, rates, systemd units, type marker."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_ships_package_data(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("calque-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "calque/py.typed",
        "calque/data/gpu-catalog.yaml",
        "calque/data/ec2-rates.yaml",
        "calque/session/systemd/calque-session.service",
        "calque/session/systemd/session.example.yaml",
    ):
        assert needed in names, f"{needed} missing from {wheel.name}"
    assert not any(n.startswith("modal/") for n in names), "the modal stand-in must never ship as a top-level package"
