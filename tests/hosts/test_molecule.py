"""``molecule test -s <role>`` for every scenario of calque.gpu, on booted Debian hosts.

The scenarios live in ``collections/ansible_collections/calque/gpu/extensions/molecule/<role>/``
and share ``config.yml`` there (create/destroy through tests/hosts). Each role must have one; the
e2e tier (test_site_e2e.py) also converges the roles together through site.yml.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from .estate import FRONT, H100, RESEARCH, SPECS, TEACH_A
from .scenarios import MOLECULE_DIR, MoleculeRuns, roles, scenarios

ANSI = re.compile(r"\x1b\[[0-9;]*m")


# Roles that run only on the controller and never touch a host: a booted host would test nothing
# of theirs; their playbook tests (named here, which must exist) run them for real instead.
CONTROLLER_ROLES = {
    "preflight": "tests/ansible/test_preflight.py",
    # AWS from the controller; its hosts make themselves from user-data
    "session_fleet": "tests/ansible/test_session_fleet_playbook.py",
    "pool": "tests/ansible/test_pool_playbook.py",  # pool.yml's role: AWS from the controller
}
# Host roles proven on the booted estate alone: site.yml converges them there (its second run must change
# nothing), and the test named here checks what they made. A scenario of its own would install the same
# ~100 wheels again (about two minutes of pip) for no behaviour the estate does not already check.
ESTATE_ROLES = {
    "jupyterhub": "tests/hosts/test_frontdoor_e2e.py",  # on the front door with calque_notebooks: true
}


# Scenarios without molecule's idempotence step, and the estate host that proves it instead: the estate
# converges the same role there, on a host of the same shape, and test_site_e2e.py's first test runs
# site.yml a second time and asserts it changes nothing on every host. Running both cost the suite about
# 200 s of molecule runs for no behaviour the estate does not already check. The scenarios kept whole are
# the ones whose path the estate never takes: the runtime from nothing (estate hosts have the dependency
# layer), the driver on a fresh host, pool workers and monitoring (not in site.yml's estate).
IDEMPOTENT_IN_ESTATE = {
    "munge": H100,
    "session_service": TEACH_A,
    "session_frontdoor": FRONT,
    "gpu_layout": f"{TEACH_A} {RESEARCH}",
}


def sequence(scenario: str) -> list[str]:
    """The scenario's test sequence: its own molecule.yml's, else the shared config.yml's."""
    own = yaml.safe_load((MOLECULE_DIR / scenario / "molecule.yml").read_text()) or {}
    shared = yaml.safe_load((MOLECULE_DIR / "config.yml").read_text())
    steps: list[str] = (own.get("scenario") or shared["scenario"]).get("test_sequence") or []
    return steps


def test_a_scenario_skips_idempotence_only_where_an_estate_host_of_its_shape_proves_it() -> None:
    estate = {s.name: s.shape for s in SPECS}
    for scenario in scenarios():
        steps = sequence(scenario)
        assert {"converge", "verify"} <= set(steps), f"{scenario}: {steps}"
        if scenario not in IDEMPOTENT_IN_ESTATE:
            assert "idempotence" in steps, f"{scenario} must keep its idempotence step: no estate host proves it"
            continue
        assert "idempotence" not in steps, f"{scenario}: the estate proves it; drop the step or the entry"
        hosts = IDEMPOTENT_IN_ESTATE[scenario].split()
        own = yaml.safe_load((MOLECULE_DIR / scenario / "molecule.yml").read_text())
        shapes = sorted(p.get("shape", "none") for p in own["platforms"])
        assert shapes == sorted(estate[h] for h in hosts), f"{scenario}: {shapes} vs the estate's {hosts}"


def test_every_role_has_a_molecule_scenario() -> None:
    root = Path(__file__).resolve().parents[2]
    for role, test in CONTROLLER_ROLES.items():
        assert role in roles() and (root / test).is_file(), f"controller-only role {role}: {test} is missing"
    collection_plays = root / "collections/ansible_collections/calque/gpu/playbooks"
    plays = "".join(p.read_text() for p in collection_plays.glob("*.yml"))
    for role, test in ESTATE_ROLES.items():
        assert role in roles() and (root / test).is_file(), f"estate-only role {role}: {test} is missing"
        assert f"role: calque.gpu.{role}" in plays, f"estate-only role {role}: site.yml's plays must converge it"
    missing = sorted(set(roles()) - set(scenarios()) - set(CONTROLLER_ROLES) - set(ESTATE_ROLES))
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
    for step in [s for s in sequence(scenario) if s in ("converge", "idempotence", "verify")]:
        # molecule writes "scenario ➜ step", or "scenario > step" without colours
        assert re.search(rf"{scenario} (➜|>) {step}: Executed: Successful", text), f"{step} did not run; log: {log}"
