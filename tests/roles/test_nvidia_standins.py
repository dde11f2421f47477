"""The stand-in NVIDIA repository the role scenarios install from: real names and versions, a driver that
answers only once "loaded"."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from roles.nvidia_standins import DRIVER_VERSION, build_repo, detection_smi

pytestmark = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v dpkg-deb && command -v dpkg-scanpackages"], capture_output=True).returncode,
    reason="needs dpkg-deb and dpkg-scanpackages (dpkg-dev)",
)


def _index(repo: Path) -> dict[str, str]:
    stanzas = (repo / "Packages").read_text().strip().split("\n\n")
    fields = [dict(line.split(": ", 1) for line in s.splitlines() if ": " in line) for s in stanzas]
    return {f["Package"]: f["Version"] for f in fields}


def test_index_carries_nvidias_package_names_and_versions(tmp_path: Path) -> None:
    repo = build_repo(tmp_path / "repo", kernel="6.1.0-28-amd64")
    full = f"{DRIVER_VERSION}-1"
    assert _index(repo) == {
        "nvidia-open": full,
        "nvidia-driver-pinning-580": full,
        "nvidia-fabricmanager": full,
        "libnvidia-nscq": full,
        "cuda-keyring": "1.1-1",
        "linux-headers-6.1.0-28-amd64": "1",
    }


def test_driver_package_ships_smi_persistenced_mps_control_and_a_boot_time_load(tmp_path: Path) -> None:
    repo = build_repo(tmp_path / "repo", kernel="k")
    listing = subprocess.run(
        ["dpkg-deb", "-c", str(repo / f"nvidia-open_{DRIVER_VERSION}-1_all.deb")], capture_output=True, text=True
    ).stdout
    for path in (
        "./usr/bin/nvidia-smi",
        "./usr/bin/nvidia-persistenced",
        "./usr/bin/nvidia-cuda-mps-control",
        "./lib/systemd/system/nvidia-persistenced.service",
        "./etc/systemd/system/multi-user.target.wants/nvidia-standin-load.service -> "
        "/lib/systemd/system/nvidia-standin-load.service",
    ):
        assert path in listing


def test_installed_smi_fails_until_the_driver_is_loaded(tmp_path: Path) -> None:
    repo = build_repo(tmp_path / "repo", kernel="k")
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", str(repo / f"nvidia-open_{DRIVER_VERSION}-1_all.deb"), str(root)], check=True)
    smi = root / "usr/bin/nvidia-smi"
    # The script reads /run/nvidia-standin; point it at a directory of this test instead.
    script = smi.read_text().replace("/run/nvidia-standin", str(tmp_path / "run"))
    smi.write_text(script)
    query = [str(smi), "--query-gpu=driver_version", "--format=csv,noheader"]
    before = subprocess.run(query, capture_output=True, text=True)
    assert before.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in before.stdout
    (tmp_path / "run").mkdir()
    (tmp_path / "run/loaded-version").write_text(DRIVER_VERSION + "\n")
    after = subprocess.run(query, capture_output=True, text=True, check=True)
    assert after.stdout.strip() == DRIVER_VERSION


def test_detection_smi_answers_the_given_version(tmp_path: Path) -> None:
    assert (build_repo(tmp_path / "repo", kernel="k") / "nvidia-smi-working").read_text() == detection_smi()
    smi = tmp_path / "nvidia-smi"
    smi.write_text(detection_smi("595.91.07"))
    smi.chmod(0o755)
    out = subprocess.run([str(smi), "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert out.strip() == "595.91.07"
