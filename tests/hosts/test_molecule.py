"""``molecule test -s <role>`` for every scenario of calque.gpu, on booted Debian hosts.

The scenarios live in ``collections/ansible_collections/calque/gpu/extensions/molecule/<role>/``
and share ``config.yml`` there (create/destroy through tests/hosts). Each role must have one; the
e2e tier (test_site_e2e.py) also converges the roles together through site.yml.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .scenarios import MOLECULE_DIR, MoleculeRuns, roles, scenarios

ANSI = re.compile(r"\x1b\[[0-9;]*m")


# Roles that run only on the controller and never touch a host: a booted host would test nothing
# of theirs; their playbook tests (named here, which must exist) run them for real instead.
CONTROLLER_ROLES = {
    "preflight": "tests/ansible/test_preflight.py",
    # AWS from the controller; its hosts make themselves from user-data
    "session_fleet": "tests/ansible/test_session_fleet_playbook.py",
}


def test_every_role_has_a_molecule_scenario() -> None:
    root = Path(__file__).resolve().parents[2]
    for role, test in CONTROLLER_ROLES.items():
        assert role in roles() and (root / test).is_file(), f"controller-only role {role}: {test} is missing"
    missing = sorted(set(roles()) - set(scenarios()) - set(CONTROLLER_ROLES))
    assert not missing, f"roles without a molecule scenario in {MOLECULE_DIR}: {missing}"


@pytest.mark.hosts
@pytest.mark.slow
@pytest.mark.parametrize("scenario", scenarios())
def test_molecule_scenario_converges_idempotently_and_verifies(scenario: str, molecule_runs: MoleculeRuns) -> None:
    # Run in the background beside the e2e (conftest.py's molecule_runs), two scenarios at a time.
    rc = molecule_runs.wait(scenario)
    log = molecule_runs.log(scenario)
    text = ANSI.sub("", log.read_text(errors="replace"))
    assert rc == 0, f"molecule test -s {scenario} exited {rc} (log: {log}):\n" + "\n".join(text.splitlines()[-80:])
    for step in ("converge", "idempotence", "verify"):
        # molecule writes "scenario ➜ step", or "scenario > step" without colours
        assert re.search(rf"{scenario} (➜|>) {step}: Executed: Successful", text), f"{step} did not run; log: {log}"
