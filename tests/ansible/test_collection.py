"""The calque.gpu collection as a package: what `ansible-galaxy collection build` ships, its changelog
fragments, and the `gpu` action group."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from calque.gpu.sim import SimGpu
from support.ansible import BIN, COLLECTIONS, run_playbook

pytestmark = pytest.mark.slow
COLLECTION = COLLECTIONS / "ansible_collections" / "calque" / "gpu"


def _build(tmp_path: Path) -> list[str]:
    out = tmp_path / "dist"
    proc = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(out), str(COLLECTION)],
        capture_output=True,
        text=True,
        env={"ANSIBLE_HOME": str(tmp_path / ".ansible"), "PATH": f"{BIN}:/usr/bin:/bin"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tarball,) = out.glob("calque-gpu-*.tar.gz")
    with tarfile.open(tarball) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
        names = tar.getnames()
    assert manifest["collection_info"]["license"] == ["GPL-3.0-or-later"]
    assert "amazon.aws" in manifest["collection_info"]["dependencies"]
    return names


def test_build_ships_license_roles_meta_and_ee_files_and_no_junk(tmp_path: Path) -> None:
    names = _build(tmp_path)
    for wanted in (
        "LICENSE",
        "meta/runtime.yml",
        "meta/execution-environment.yml",
        "requirements.txt",
        "bindep.txt",
        "changelogs/config.yaml",
        "changelogs/changelog.yaml",
        "roles/nvidia_driver/meta/argument_specs.yml",
        "roles/nvidia_driver/tasks/main.yml",
        "roles/gpu_layout/meta/argument_specs.yml",
        "roles/gpu_layout/templates/calque-gpu.service.j2",
        "roles/monitoring/files/prometheus/calque-rules.yml",
        "roles/monitoring/files/grafana/calque-pools.json",
        "plugins/modules/mig.py",
    ):
        assert wanted in names, f"{wanted} is missing from the built collection"
    junk = [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".tar.gz")) or n.startswith("tests/output")]
    assert junk == []
    assert "CHANGELOG.md" not in names, "changes are changelog fragments, not a hand-kept CHANGELOG"


def test_changelog_fragments_pass_antsibull_changelog_lint() -> None:
    proc = subprocess.run([str(BIN / "antsibull-changelog"), "lint"], cwd=COLLECTION, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "", proc.stdout + proc.stderr
    assert list((COLLECTION / "changelogs" / "fragments").glob("*.yml")), "no changelog fragments"


def test_gpu_group_module_defaults_reach_every_gpu_module(tmp_path: Path) -> None:
    sim = SimGpu.create(tmp_path / "gpus.json", ["A100-40GB"], mig=True)
    layout = [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}]
    run = run_playbook(
        tmp_path,
        [
            {"name": "layout", "calque.gpu.mig": {"layout": layout}},
            {"name": "facts", "calque.gpu.gpu_info": {}},
        ],
        module_defaults={"group/calque.gpu.gpu": {"sim_state": str(sim.state_path)}},
    )
    assert run.rc == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.task("layout")["changed"] is True
    facts = run.task("facts")
    assert facts["backend"] == "SimGpu"
    assert [d["profile"] for d in facts["gpus"][0]["mig_devices"]] == ["3g.20gb", "3g.20gb"]
