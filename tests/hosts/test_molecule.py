"""``molecule test -s <role>`` for every scenario of calque.gpu, on booted Debian hosts.

The scenarios live in ``collections/ansible_collections/calque/gpu/extensions/molecule/<role>/``
and share ``config.yml`` there (create/destroy through tests/hosts). Each role must have one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .paths import HOSTS_DIR
from .scenarios import MOLECULE_DIR, roles, run_molecule, scenarios

SCENARIO_TIMEOUT = 900  # seconds; a hung scenario is killed (its process group) and torn down
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_every_role_has_a_molecule_scenario() -> None:
    missing = sorted(set(roles()) - set(scenarios()))
    assert not missing, f"roles without a molecule scenario in {MOLECULE_DIR}: {missing}"


@pytest.mark.hosts
@pytest.mark.slow
@pytest.mark.parametrize("scenario", scenarios())
def test_molecule_scenario_converges_idempotently_and_verifies(
    scenario: str, wheelhouse: Path, host_image: Path
) -> None:
    log = HOSTS_DIR / "logs" / f"molecule-{scenario}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    rc = run_molecule(scenario, ["test"], log=log, timeout=SCENARIO_TIMEOUT)
    text = ANSI.sub("", log.read_text(errors="replace"))
    assert rc == 0, f"molecule test -s {scenario} exited {rc} (log: {log}):\n" + "\n".join(text.splitlines()[-80:])
    for step in ("converge", "idempotence", "verify"):
        # molecule writes "scenario ➜ step", or "scenario > step" without colours
        assert re.search(rf"{scenario} (➜|>) {step}: Executed: Successful", text), f"{step} did not run; log: {log}"
