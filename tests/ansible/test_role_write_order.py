"""Files a service reads at start are installed only after what they depend on has passed: read from the
roles' task files in the order Ansible runs them (blocks flattened, ``always`` last), no playbook run.

- gpu_layout: ``/etc/calque/mig-layout.yaml`` (what ``calque-gpu.service`` applies at every boot) is written
  after the apply succeeded; written between the plan and the apply, an apply refused because a session was
  checked out in between left a file the next boot applied over the held slice.
- session_service: ``/etc/calque/institution.yaml`` (which the running daemon reads again on change) is
  written after the session configuration was checked with that very institution, staged; written first, a
  check that failed left the daemon running with an institution its configuration was never checked with.
- session_frontdoor: the same institution file is written after ``broker.yaml`` passed its check with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROLES = Path(__file__).resolve().parents[2] / "collections/ansible_collections/calque/gpu/roles"


def _tasks(path: Path) -> list[dict[str, Any]]:
    """The file's tasks in run order (a block's tasks, then its ``always``)."""

    def flat(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for t in tasks:
            if "block" in t:
                out += flat(t["block"]) + flat(t.get("rescue", [])) + flat(t.get("always", []))
            else:
                out.append(t)
        return out

    return flat(yaml.safe_load(path.read_text()))


def _index(tasks: list[dict[str, Any]], starts: str) -> int:
    found = [i for i, t in enumerate(tasks) if t.get("name", "").startswith(starts)]
    assert len(found) == 1, f"one task named {starts!r}: {[t.get('name') for t in tasks]}"
    return found[0]


def _when(task: dict[str, Any]) -> str:
    when = task.get("when", [])
    return " and ".join(when) if isinstance(when, list) else str(when)


def test_the_boot_time_layout_file_is_written_only_after_the_apply_succeeded() -> None:
    tasks = _tasks(ROLES / "gpu_layout/tasks/mig.yml")
    plan, apply = _index(tasks, "Plan MIG config"), _index(tasks, "Apply MIG config")
    write = _index(tasks, "Write the layout file calque-gpu.service applies at boot")
    assert tasks[plan]["check_mode"] is True and "check_mode" not in tasks[apply]
    assert tasks[write]["ansible.builtin.copy"]["dest"] == "{{ calque_gpu_layout_file }}"
    assert plan < apply < write
    assert "__calque_gpu_layout_mig_apply is succeeded" in _when(tasks[write])
    assert "__calque_gpu_layout_mig_plan.refusal is none" in _when(tasks[write])  # check mode: the refused run


def test_institution_yaml_is_written_only_after_the_session_config_passed_its_check_with_it() -> None:
    tasks = _tasks(ROLES / "session_service/tasks/configure.yml")
    stage = _index(tasks, "Configure | Render the institution into the staged file")
    check = _index(tasks, "Configure | Check the session configuration")
    refuse = _index(tasks, "Configure | Refuse a session configuration")
    install = _index(tasks, "Configure | The institution /etc/calque/institution.yaml")
    remove = _index(tasks, "Configure | Remove the staged institution")
    staged = "__calque_session_service_institution_staged.path"
    assert tasks[stage]["ansible.builtin.template"]["dest"] == "{{ " + staged + " }}"
    assert tasks[stage]["check_mode"] is False  # check mode checks the pair too
    argv = tasks[check]["ansible.builtin.command"]["argv"]
    assert argv[1:5] == ["config", "check", "session", "-"] and argv[5] == "--institution" and staged in argv[6]
    assert tasks[install]["ansible.builtin.template"]["dest"] == "{{ _calque_session_service_institution_path }}"
    assert stage < check < refuse < install < remove
    assert _when(tasks[refuse]) == "__calque_session_service_check.rc != 0"


def test_the_front_doors_institution_yaml_is_written_only_after_broker_yaml_passed_its_check_with_it() -> None:
    tasks = _tasks(ROLES / "session_frontdoor/tasks/broker.yml")
    stage = _index(tasks, "Render the institution into the staged file")
    broker = _index(tasks, "Broker configuration /etc/calque/broker.yaml")
    install = _index(tasks, "The institution /etc/calque/institution.yaml")
    remove = _index(tasks, "Remove the staged institution")
    validate = tasks[broker]["ansible.builtin.template"]["validate"]
    assert "config check broker %s --institution" in validate
    assert "__calque_session_frontdoor_institution_staged.path" in validate
    assert stage < broker < install < remove
