"""docs/institution.md's by-hand path stays runnable: every harness command and option it shows exists,
every calque variable it names is documented by a role's argument spec, and the inventory it builds is
the one the e2e test and the sandbox boot with (``institution_inventory``)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from .__main__ import main
from .institution import institution_inventory

DOC = Path(__file__).resolve().parents[2] / "docs" / "institution.md"
ROLES = Path(__file__).resolve().parents[2] / "collections/ansible_collections/calque/gpu/roles"


def _shell_commands(text: str) -> list[list[str]]:
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    joined = "\n".join(b.replace("\\\n", " ") for b in blocks)
    lines = [line.split("#")[0].strip() for line in joined.splitlines()]
    return [shlex.split(line) for line in lines if line and "<<" not in line and not line.startswith("EOF")]


def test_every_harness_command_and_option_the_doc_shows_exists() -> None:
    shown = [c for c in _shell_commands(DOC.read_text()) if c[:3] == [".venv/bin/python", "-m", "tests.hosts"]]
    assert {c[3] for c in shown} >= {"up", "institution", "down"}
    for cmd in shown:
        sub = main.commands[cmd[3]]
        options = {o for p in sub.params for o in getattr(p, "opts", [])}
        used = {a.split("=")[0] for a in cmd[4:] if a.startswith("--")}
        assert used <= options, f"{' '.join(cmd)}: {sorted(used - options)} not options of `{cmd[3]}`"


def test_every_variable_the_doc_names_is_documented() -> None:
    documented: set[str] = set()
    for spec in ROLES.glob("*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(spec.read_text())["argument_specs"].values():
            documented |= set(entry.get("options") or {})
    named = set(re.findall(r"(?<![\w])calque_[a-z0-9_]+", DOC.read_text()))
    groups = {
        "calque_gpu_hosts",
        "calque_session_hosts",
        "calque_session_frontdoor",
        "calque_pool_hosts",
        "calque_controller",
    }
    assert named - groups - documented == set()


def test_the_doc_describes_the_inventory_the_harness_builds() -> None:
    text = DOC.read_text()
    source = Path(institution_inventory.__code__.co_filename).read_text()
    for key in (
        "calque_runtime_wheelhouse",
        "calque_nvidia_driver_apt_source",
        "calque_nvidia_driver_continue_before_reboot",
    ):
        assert key in source and key in text
    for made in ("groups.yml", "host_vars", "hosts.yml"):
        assert made in source and made in text
