"""calque.gpu.runtime's /etc/calque/host.yaml is checked by calque before anything is written, in check mode too.

Real ``ansible-playbook`` runs of the role's configure step on this machine (a local connection), with
the host configuration's path and the simulator's state under a temporary directory and this
checkout's venv as the role's: a value calque would refuse (an instance type the GPU catalog lacks,
which the argument spec cannot know) fails the play naming the inventory variable, and every file
stays as it was.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml
from test_checkout_config import REPO, ansible

pytestmark = pytest.mark.slow
GOOD = "gpu:\n  version: 1\n  backend: nvml\n"


def _run(tmp_path: Path, sim: dict[str, object], *, check: bool) -> tuple[int, str, Path]:
    etc = tmp_path / "etc/calque"
    etc.mkdir(parents=True)
    host_yaml = etc / "host.yaml"
    host_yaml.write_text(GOOD)
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "tasks": [{"ansible.builtin.include_role": {"name": "calque.gpu.runtime", "tasks_from": "configure"}}],
        }
    ]
    book = tmp_path / "configure.yml"
    book.write_text(yaml.safe_dump(play))
    extra = {
        "ansible_python_interpreter": sys.executable,
        "calque_runtime_venv": str(REPO / ".venv"),
        "_calque_runtime_host_config": str(host_yaml),
        "calque_runtime_gpu_backend": "sim",
        "calque_runtime_gpu_sim": sim,
    }
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(extra))
    args = ["-i", "localhost,", str(book), "-e", f"@{tmp_path / 'vars.yml'}", *(["--check", "--diff"] if check else [])]
    r = ansible(tmp_path, "ansible-playbook", *args)
    return r.returncode, r.stdout + r.stderr, host_yaml


@pytest.mark.parametrize(
    "check",
    [True, pytest.param(False, marks=pytest.mark.skipif(os.geteuid() != 0, reason="the real run writes root's files"))],
    ids=["check", "real"],
)
def test_a_host_configuration_calque_refuses_fails_before_any_file_is_written(tmp_path: Path, check: bool) -> None:
    state = tmp_path / "sim/gpus.json"
    rc, out, host_yaml = _run(tmp_path, {"state": str(state), "instance_type": "g6e.xlarg"}, check=check)
    assert rc != 0, out
    assert "Refuse a host configuration calque would not load" in out, out
    assert "sim.instance_type='g6e.xlarg': unknown size 'xlarg' for g6e" in out, out
    assert "Fix calque_runtime_gpu_sim" in out and "nothing was written" in out, out
    assert "calque-config-check-" not in out  # calque's message names standard input, not a staged copy
    assert host_yaml.read_text() == GOOD  # the installed file as it was
    assert not state.parent.exists()  # nor the simulator's directory made
    assert "changed=0" in out, out


def test_check_mode_passes_a_good_host_configuration_and_shows_its_diff(tmp_path: Path) -> None:
    state = tmp_path / "sim/gpus.json"
    rc, out, host_yaml = _run(tmp_path, {"state": str(state), "instance_type": "g6e.xlarge"}, check=True)
    assert rc == 0, out
    assert "+  backend: sim" in out and "instance_type: g6e.xlarge" in out, out
    assert host_yaml.read_text() == GOOD and not state.parent.exists()  # check mode writes nothing
