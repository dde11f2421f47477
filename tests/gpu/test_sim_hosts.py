"""Simulated GPU UUIDs: the same host gets the same UUIDs every time, two hosts never share one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from calque.gpu.sim import SimGpu
from support.waits import HANG_S

_CREATE = (
    "import json, sys; from calque.gpu.sim import SimGpu; "
    "sim = SimGpu.create(sys.argv[1], ['A100-40GB', 'A100-40GB'], mig=True); "
    "made = sim.create_instances(0, ['3g.20gb']); "
    "print(json.dumps([g.uuid for g in sim.gpus()] + [d.uuid for d in made]))"
)


def _uuids_on(hostname: str, state: Path) -> list[str]:
    """The UUIDs a simulated host gets when created on a machine called ``hostname`` (its own UTS namespace)."""
    cmd = ["unshare", "--uts", "sh", "-c", f'hostname {hostname} && exec "$@"', "-", sys.executable, "-c", _CREATE]
    out = subprocess.run([*cmd, str(state)], capture_output=True, text=True, timeout=HANG_S, check=True)
    return list(json.loads(out.stdout))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="a UTS namespace needs root")
def test_two_hosts_never_share_a_gpu_uuid_and_one_host_keeps_its_own(tmp_path: Path) -> None:
    teach0 = _uuids_on("teach0", tmp_path / "a.json")
    teach1 = _uuids_on("teach1", tmp_path / "b.json")
    assert len(set(teach0)) == len(teach0) == 3
    assert not set(teach0) & set(teach1)
    assert _uuids_on("teach0", tmp_path / "again.json") == teach0


def test_an_explicit_seed_names_the_host(tmp_path: Path) -> None:
    one = SimGpu.create(tmp_path / "one.json", ["L4-24GB"], seed="research0")
    two = SimGpu.create(tmp_path / "two.json", ["L4-24GB"], seed="research1")
    same = SimGpu.create(tmp_path / "same.json", ["L4-24GB"], seed="research0")
    assert one.gpus()[0].uuid != two.gpus()[0].uuid
    assert one.gpus()[0].uuid == same.gpus()[0].uuid
