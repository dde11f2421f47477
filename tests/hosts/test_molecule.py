"""``molecule test -s <role>`` for every scenario of calque.gpu, on booted Debian hosts.

The scenarios live in ``collections/ansible_collections/calque/gpu/extensions/molecule/<role>/``
and share ``config.yml`` there (create/destroy through tests/hosts). Every role is tested on booted
hosts: by a scenario of its own, or by the e2e tier (test_site_e2e.py), whose site.yml converges the
roles of the gpu and session plays on three hosts, checks that a second run changes nothing and
checks what each role leaves. A scenario for those would converge the same role again, at about two
minutes each, for no check the e2e does not make.
"""

from __future__ import annotations

import re

import pytest
import yaml

from .scenarios import COLLECTION, MOLECULE_DIR, MoleculeRuns, roles, scenarios

ANSI = re.compile(r"\x1b\[[0-9;]*m")


# The plays of calque.gpu.site that the e2e inventory's groups run (its hosts are in these groups).
E2E_PLAYBOOKS = ("gpu_hosts.yml", "session_hosts.yml")


def e2e_roles() -> set[str]:
    found = set()
    for name in E2E_PLAYBOOKS:
        for play in yaml.safe_load((COLLECTION / "playbooks" / name).read_text()):
            assert play["hosts"] in ("calque_gpu_hosts", "calque_session_hosts"), f"{name}: {play['hosts']}"
            found |= {r["role"].removeprefix("calque.gpu.") for r in play.get("roles", [])}
    return found


def test_every_role_is_tested_on_booted_hosts_by_a_scenario_or_the_e2e() -> None:
    site = (COLLECTION / "playbooks" / "site.yml").read_text()
    assert all(f"calque.gpu.{p.removesuffix('.yml')}" in site for p in E2E_PLAYBOOKS)
    missing = sorted(set(roles()) - set(scenarios()) - e2e_roles())
    assert not missing, f"roles neither in a molecule scenario ({MOLECULE_DIR}) nor in the e2e's site.yml: {missing}"


@pytest.mark.hosts
@pytest.mark.slow
@pytest.mark.parametrize("scenario", scenarios())
def test_molecule_scenario_converges_idempotently_and_verifies(scenario: str, molecule_runs: MoleculeRuns) -> None:
    # Run in the background beside the e2e (conftest.py's molecule_runs), one scenario at a time.
    rc = molecule_runs.wait(scenario)
    log = molecule_runs.log(scenario)
    text = ANSI.sub("", log.read_text(errors="replace"))
    assert rc == 0, f"molecule test -s {scenario} exited {rc} (log: {log}):\n" + "\n".join(text.splitlines()[-80:])
    for step in ("converge", "idempotence", "verify"):
        # molecule writes "scenario ➜ step", or "scenario > step" without colours
        assert re.search(rf"{scenario} (➜|>) {step}: Executed: Successful", text), f"{step} did not run; log: {log}"
