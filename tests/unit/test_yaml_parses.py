"""Every YAML document of the repository parses (files, and the modules' DOCUMENTATION/EXAMPLES/RETURN), and
what ansible-lint lints keeps its line length.

A ``: `` inside a plain scalar (a description's "reason: ...") is the usual break. ansible-test sanity and
ansible-lint would say so too, but minutes later and in a gate's log; this says it in a second, by file.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MODULES = REPO / "collections/ansible_collections/calque/gpu/plugins/modules"
MODULE_DOCS = ("DOCUMENTATION", "EXAMPLES", "RETURN")


def tracked_yaml() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "*.yml", "*.yaml"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return sorted(out.split())


@pytest.mark.parametrize("path", tracked_yaml())
def test_every_yaml_file_parses(path: str) -> None:
    with (REPO / path).open() as fh:
        for _ in yaml.safe_load_all(fh):  # a syntax error raises, naming the line and column
            pass


# ansible-lint's yaml rule (production profile) over what it lints: the collection and the playbooks.
LINTED = ("collections/ansible_collections/calque/", "playbooks/")
LINE_MAX = 160


def test_linted_yaml_lines_fit_ansible_lints_length() -> None:
    long = [
        f"{path}:{n}"
        for path in tracked_yaml()
        if path.startswith(LINTED)
        for n, line in enumerate((REPO / path).read_text().splitlines(), 1)
        if len(line) > LINE_MAX
    ]
    assert long == [], f"lines over {LINE_MAX} characters (ansible-lint's yaml[line-length]): {long}"


@pytest.mark.parametrize("module", sorted(p.name for p in MODULES.glob("*.py")))
def test_every_modules_documentation_parses(module: str) -> None:
    tree = ast.parse((MODULES / module).read_text())
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in MODULE_DOCS:
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            try:
                yaml.safe_load(node.value.value)
            except yaml.YAMLError as exc:
                raise AssertionError(f"{module}'s {node.targets[0].id} is not valid YAML: {exc}") from None
            found.add(node.targets[0].id)
    assert found == set(MODULE_DOCS), f"{module} lacks {set(MODULE_DOCS) - found}"
