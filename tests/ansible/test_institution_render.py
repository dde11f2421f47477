"""The session_service role's templates rendered by real Ansible from an institution in inventory, and
read back by the models the daemons load: this host's entry becomes ``listen_tcp`` and ``host_name``, the
institution becomes ``/etc/calque/institution.yaml``; a host outside it listens on no TCP port. Where
notebooks run (``calque_notebooks``) the single-user server is the venv's and binds the host's address."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from calque.models.institution import Institution
from calque.session.session_config import SessionConfig

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "collections/ansible_collections/calque/gpu/roles/session_service"
BIN = Path(sys.executable).parent

INSTITUTION = {
    "hosts": [
        {"name": "teach-1", "address": "10.0.0.11", "port": 7461, "offers": ["1g.24gb"]},
        {"name": "research-1", "address": "10.0.0.21", "offers": ["mps"]},
    ],
    "broker": {"address": "10.0.0.9", "port": 7460, "service_user": "calque-broker"},
    "labs": [{"name": "lab-a", "groups": ["lab-a"], "share": 2}],
}

PLAY = """
- hosts: localhost
  gather_facts: false
  vars_files: [{defaults}, {vars}]
  tasks:
    - ansible.builtin.template:
        {{src: {role}/templates/session.yaml.j2, dest: "{{{{ out }}}}/session.yaml", mode: "0644"}}
    - ansible.builtin.template:
        {{src: {role}/templates/institution.yaml.j2, dest: "{{{{ out }}}}/institution.yaml", mode: "0644"}}
"""


def _render(tmp_path: Path, host_name: str, **more: object) -> tuple[SessionConfig, Institution]:
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(defaults=ROLE / "defaults/main.yml", vars=ROLE / "vars/main.yml", role=ROLE))
    extra: dict[str, object] = {"out": str(tmp_path), "calque_session_service_institution": INSTITUTION}
    extra["ansible_python_interpreter"] = sys.executable
    extra["calque_session_service_host_name"] = host_name
    extra.update(more)
    env = {**os.environ, "ANSIBLE_HOME": str(tmp_path / ".ansible"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / ".tmp")}
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play), "-e", json.dumps(extra)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    session = SessionConfig.model_validate(yaml.safe_load((tmp_path / "session.yaml").read_text()))
    institution = Institution.model_validate(yaml.safe_load((tmp_path / "institution.yaml").read_text()))
    return session, institution


@pytest.mark.slow
def test_a_host_of_the_institution_listens_on_its_own_address(tmp_path: Path) -> None:
    session, institution = _render(tmp_path, "teach-1", calque_notebooks=True)
    assert session.notebook_ip == "10.0.0.11"  # where the hub's proxy on the front door connects
    assert session.notebook_command == ["/opt/calque/venv/bin/jupyterhub-singleuser", "--ip={ip}", "--port={port}"]
    assert session.notebook_env["PATH"].startswith("/opt/calque/venv/bin:")
    assert session.listen_tcp is not None
    assert (session.listen_tcp.address, session.listen_tcp.port) == ("10.0.0.11", 7461)
    assert session.host_name == "teach-1"
    assert institution.broker is not None and institution.broker.service_user == "calque-broker"
    assert [h.name for h in institution.hosts] == ["teach-1", "research-1"] and institution.labs[0].share == 2


@pytest.mark.slow
def test_a_host_outside_the_institution_listens_on_no_tcp_port(tmp_path: Path) -> None:
    session, _ = _render(tmp_path, "elsewhere")
    assert session.listen_tcp is None and session.host_name is None
    assert session.notebook_command == SessionConfig().notebook_command  # no notebooks here: the daemon's own


@pytest.mark.slow
def test_calque_labs_become_the_labs_with_their_budgets(tmp_path: Path) -> None:
    labs = {
        "lab-b": {"groups": ["lab-b", "lab-b-students"], "budget": {"usd": 2000, "notify_at": 0.9}},
        "lab-a": {"groups": ["lab-a"], "share": 2, "budget": {"gpu_hours": 500, "raised_by": "rc@example.edu"}},
    }
    _, institution = _render(tmp_path, "teach-1", calque_labs=labs)
    got = {lab.name: lab for lab in institution.labs}
    assert sorted(got) == ["lab-a", "lab-b"]  # calque_labs replaces the institution's own labs
    a, b = got["lab-a"], got["lab-b"]
    assert a.share == 2 and a.budget is not None and (a.budget.gpu_hours, a.budget.raised_by) == (500, "rc@example.edu")
    assert b.groups == ["lab-b", "lab-b-students"] and b.budget is not None and b.budget.unit == "USD"
    assert b.budget.notify_at == 0.9 and institution.broker is not None  # the rest of the institution stays
