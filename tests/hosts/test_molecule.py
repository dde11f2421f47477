"""``molecule test -s <role>`` for every scenario of calque.gpu, on booted Debian hosts.

The scenarios live in ``collections/ansible_collections/calque/gpu/extensions/molecule/<role>/``
and share ``config.yml`` there (create/destroy through tests/hosts). Each role must have one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from .fleet import Fleet
from .paths import HOSTS_DIR, REPO

COLLECTION = REPO / "collections" / "ansible_collections" / "calque" / "gpu"
MOLECULE_DIR = COLLECTION / "extensions" / "molecule"
SCENARIOS = sorted(p.parent.name for p in MOLECULE_DIR.glob("*/molecule.yml"))
ROLES = (
    sorted(p.name for p in (COLLECTION / "roles").iterdir() if p.is_dir()) if (COLLECTION / "roles").is_dir() else []
)
SCENARIO_TIMEOUT = 900  # seconds; a hung scenario is killed (its process group) and torn down
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_every_role_has_a_molecule_scenario() -> None:
    missing = sorted(set(ROLES) - set(SCENARIOS))
    assert not missing, f"roles without a molecule scenario in {MOLECULE_DIR}: {missing}"


@pytest.mark.hosts
@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario_converges_idempotently_and_verifies(
    scenario: str, wheelhouse: Path, host_image: Path
) -> None:
    venv_bin = REPO / ".venv" / "bin"
    env = {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "NO_COLOR": "1",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
    }
    log = HOSTS_DIR / "logs" / f"molecule-{scenario}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(venv_bin / "molecule"), "test", "-s", scenario],
            cwd=COLLECTION,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=SCENARIO_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        finally:
            # molecule's destroy normally did this; after a timeout or a broken destroy, the harness does.
            run = Fleet(f"mol-{scenario}")
            if run.state_file.exists():
                run.down()
    text = ANSI.sub("", log.read_text(errors="replace"))
    assert rc == 0, f"molecule test -s {scenario} exited {rc} (log: {log}):\n" + "\n".join(text.splitlines()[-80:])
    for step in ("converge", "idempotence", "verify"):
        assert re.search(rf"{scenario} ➜ {step}: Executed: Successful", text), f"{step} did not run; log: {log}"
