"""calque.ops.preflight without Ansible: names, the session daemon's model, MIG configs, origins."""

from __future__ import annotations

from pathlib import Path

from calque.ops.preflight import PreflightOp, PreflightRequest

KNOWN = [
    "calque_session_service_default_ttl",
    "calque_session_service_max_total_ttl",
    "calque_session_service_settings",
    "calque_session_service_user_limits",
    "calque_session_service_idle",
    "calque_gpu_layout_mig_configs",
    "calque_gpu_layout_window",
    "calque_runtime_gpu_backend",
    "calque_runtime_gpu_sim",
]


def _run(hosts: dict[str, dict[str, object]]) -> list[tuple[str, str, list[str], str | None]]:
    op = PreflightOp()
    outcome = op.run(PreflightRequest.model_validate({"hosts": hosts, "known": KNOWN}), check_mode=True)
    assert outcome.changed is False
    return [(p.variable, p.message, p.hosts, p.origin) for p in outcome.result.problems]


def test_valid_variables_pass_and_change_nothing() -> None:
    good = {"calque_session_service_default_ttl": "2h", "calque_session_service_settings": {"idle_expiry": "30m"}}
    op = PreflightOp()
    outcome = op.run(PreflightRequest.model_validate({"hosts": {"a": {"variables": good}}, "known": KNOWN}))
    assert outcome.failure is None and outcome.result.problems == []
    assert outcome.actions == ["checked 2 calque variable(s) of 1 host(s)"]


def test_each_problem_names_the_inventory_variable_once_for_all_its_hosts() -> None:
    bad = {
        "calque_session_service_max_totl_ttl": "3h",
        "calque_session_service_default_ttl": "2hours",
        "calque_session_service_settings": {"notice_befor": 60, "kill_grace": "soon"},
        "calque_session_service_user_limits": {"bob": {"max_tll": "1h"}},
        "calque_gpu_layout_mig_configs": {"x": [{"mig-enabled": True, "mig-devics": {}}]},
    }
    found = {v: (m, h) for v, m, h, _ in _run({"a": {"variables": bad}, "b": {"variables": bad}})}
    assert found["calque_session_service_max_totl_ttl"] == (
        "unknown variable; did you mean calque_session_service_max_total_ttl?",
        ["a", "b"],
    )
    assert found["calque_session_service_default_ttl"][0].startswith("'2hours' is not a duration")
    assert "did you mean notice_before?" in found["calque_session_service_settings.notice_befor"][0]
    assert "'soon'" in found["calque_session_service_settings.kill_grace"][0]
    assert found["calque_session_service_user_limits"][0].startswith("bob.max_tll is not a setting")
    assert "mig-devics" in found["calque_gpu_layout_mig_configs.x"][0]


def test_the_origin_is_the_file_ansible_ranks_highest(tmp_path: Path) -> None:
    (tmp_path / "group_vars/all").mkdir(parents=True)
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "group_vars/all/sessions.yml").write_text("calque_session_service_max_totl_ttl: 1h\n")
    (tmp_path / "group_vars/teaching.yml").write_text("calque_session_service_max_totl_ttl: 2h\nx: !vault |\n  abc\n")
    (tmp_path / "host_vars/t1.yaml").write_text("calque_session_service_max_totl_ttl: 3h\n")
    inv = str(tmp_path)
    hosts: dict[str, dict[str, object]] = {
        name: {"variables": {"calque_session_service_max_totl_ttl": "x"}, "groups": groups, "inventory_dir": inv}
        for name, groups in (("t1", ["teaching"]), ("t2", ["teaching"]), ("r1", ["research"]))
    }
    origins = {tuple(h): o for _v, _m, h, o in _run(hosts)}
    assert origins == {
        ("t1",): str(tmp_path / "host_vars/t1.yaml"),
        ("t2",): str(tmp_path / "group_vars/teaching.yml"),
        ("r1",): str(tmp_path / "group_vars/all/sessions.yml"),
    }


def test_idle_reclaim_is_checked_as_the_daemon_reads_it() -> None:
    good = {"calque_session_service_idle": {"below": "5%", "for": "30m", "warn": "10m", "exempt_groups": ["staff"]}}
    assert _run({"a": {"variables": good}}) == []
    assert _run({"a": {"variables": {"calque_session_service_idle": {}}}}) == []  # empty: off
    bad = {"calque_session_service_idle": {"below": 5, "for": "10m", "warn": "20m"}}
    found = {v: m for v, m, _, _ in _run({"a": {"variables": bad}})}
    assert "ambiguous" in found["calque_session_service_idle"]
    late = {"calque_session_service_idle": {"for": "10m", "warn": "20m"}}
    found = {v: m for v, m, _, _ in _run({"a": {"variables": late}})}
    assert "must be shorter than idle.for" in found["calque_session_service_idle"]


def test_the_layout_change_window_is_checked_before_any_host_changes() -> None:
    good = {"calque_gpu_layout_window": ["Sat,Sun 02:00-06:00", "Mon-Fri 22:00-06:00"]}
    assert _run({"a": {"variables": good}}) == []
    bad = {"calque_gpu_layout_window": ["Sat 02:00-06:00", "weekends 2-6"]}
    found = {v: m for v, m, _, _ in _run({"a": {"variables": bad}})}
    assert list(found) == ["calque_gpu_layout_window[1]"] and "'weekends 2-6'" in found["calque_gpu_layout_window[1]"]


def test_the_host_configuration_is_checked_as_calque_reads_it() -> None:
    sim = {"state": "/var/lib/calque-sim/gpus.json", "instance_type": "g6e.xlarg", "cards": None}
    found = {
        v: m
        for v, m, _, _ in _run(
            {"a": {"variables": {"calque_runtime_gpu_backend": "sim", "calque_runtime_gpu_sim": sim}}}
        )
    }
    assert list(found) == ["calque_runtime_gpu_sim.instance_type"], found
    assert found["calque_runtime_gpu_sim.instance_type"].startswith("unknown size 'xlarg' for g6e"), found
    both = {"state": "/s.json", "instance_type": "g6e.xlarge", "cards": ["L4-24GB"]}
    found = {
        v: m
        for v, m, _, _ in _run(
            {"a": {"variables": {"calque_runtime_gpu_backend": "sim", "calque_runtime_gpu_sim": both}}}
        )
    }
    why = "give sim.cards or sim.instance_type, not both (as calque reads /etc/calque/host.yaml)"
    assert found == {"calque_runtime_gpu_sim": why}
    # nvml (the default) renders no sim section: a leftover simulator setting is no problem there.
    assert _run({"a": {"variables": {"calque_runtime_gpu_sim": sim}}}) == []
    good = {"calque_runtime_gpu_backend": "sim", "calque_runtime_gpu_sim": {**sim, "instance_type": "g6e.xlarge"}}
    assert _run({"a": {"variables": good}}) == []


def test_the_institution_is_read_as_the_daemons_read_it_and_needs_a_munge_key() -> None:
    known = [*KNOWN, "calque_session_service_institution", "calque_munge_key_file"]
    inst = {"hosts": [{"name": "t1", "address": "10.0.0.1"}, {"name": "t1", "address": "teach-2.example"}]}

    def run(v: dict[str, object]) -> dict[str, str]:
        op = PreflightOp()
        outcome = op.run(PreflightRequest.model_validate({"hosts": {"a": {"variables": v}}, "known": known}))
        return {p.variable: p.message for p in outcome.result.problems}

    found = run({"calque_session_service_institution": inst})
    assert "is not an IP address" in found["calque_session_service_institution.hosts.1.address"]
    assert "munge key" in found["calque_munge_key_file"]
    inst["hosts"][1]["address"] = "10.0.0.2"  # type: ignore[index]
    found = run({"calque_session_service_institution": inst, "calque_munge_key_file": "/vault/munge.key"})
    assert found == {
        "calque_session_service_institution": "host names must be unique; repeated: t1 (as the session daemons read it)"
    }
    good = {"hosts": [{"name": "t1", "address": "10.0.0.1", "offers": ["1g.24gb"]}], "broker": {"address": "10.0.0.9"}}
    assert run({"calque_session_service_institution": good, "calque_munge_key_file": "/vault/munge.key"}) == {}


def test_a_mail_section_in_the_settings_is_checked_before_any_host_is_touched() -> None:
    good = {"calque_session_service_settings": {"mail": {"relay": "smtp.example.edu", "domain": "example.edu"}}}
    assert _run({"a": {"variables": good}}) == []
    for mail, says in (({"port": 0}, "port=0: Input should be greater"), ({"labs": {}}, "labs")):
        bad = {"calque_session_service_settings": {"mail": {"relay": "smtp.example.edu", **mail}}}
        found = {v: m for v, m, _, _ in _run({"a": {"variables": bad}})}
        assert (
            list(found) == ["calque_session_service_settings.mail"]
            and says in found["calque_session_service_settings.mail"]
        ), found
