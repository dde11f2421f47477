"""The ``calque`` root: help, version, exit codes, and a help text and docs entry for every command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import tomllib
from calque import __version__
from calque.cli.main import cli, run
from calque.errors import (
    EXIT_CODES,
    EXIT_KINDS,
    CalqueError,
    InfrastructureError,
    NothingFreeError,
    PartialFailure,
    RefusedError,
    UnreachableError,
    UsageError,
)
from click.testing import CliRunner
from support.waits import HANG_S

REPO = Path(__file__).resolve().parents[2]
CLI_DOCS = REPO / "docs" / "cli.md"


def _commands(cmd: click.Command, path: list[str]) -> Iterator[tuple[str, click.Command]]:
    yield " ".join(path), cmd
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in sorted(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, f"{name} is listed but cannot be loaded"
            yield from _commands(sub, [*path, name])


ALL_COMMANDS = list(_commands(cli, ["calque"]))


def test_help_lists_the_verb_groups_and_the_exit_codes() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for verb in ("pool", "session", "gpu", "ramp"):
        assert verb in result.output
    assert "Exit codes" in result.output
    assert run(["-h"]) == 0


def test_version_is_the_package_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert result.output.strip() == f"calque, version {__version__}"
    assert __version__ == pyproject


def test_installed_command_prints_version() -> None:
    exe = Path(sys.executable).parent / "calque"
    proc = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0
    assert __version__ in proc.stdout


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (UsageError, 2),
        (InfrastructureError, 3),
        (RefusedError, 4),
        (NothingFreeError, 5),
        (UnreachableError, 6),
        (PartialFailure, 1),
        (CalqueError, 1),
    ],
)
def test_each_error_class_becomes_its_documented_exit_code(
    error: type[CalqueError], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    @click.command("boom")
    def boom() -> None:
        raise error("what went wrong; what to change")

    cli.add_command(boom)
    try:
        assert run(["boom"]) == code
    finally:
        cli.commands.pop("boom")
    err = capsys.readouterr().err
    assert err.strip() == "calque: error: what went wrong; what to change"
    assert code in EXIT_CODES


@pytest.mark.parametrize(
    ("error", "code", "kind"),
    [
        (UsageError, 2, "usage"),
        (InfrastructureError, 3, "infrastructure"),
        (RefusedError, 4, "refused"),
        (NothingFreeError, 5, "nothing_free"),
        (UnreachableError, 6, "unreachable"),
        (PartialFailure, 1, "failure"),
    ],
)
def test_with_json_an_error_is_json_on_stderr_with_its_exit_codes_kind(
    error: type[CalqueError], code: int, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    @click.command("boom")
    @click.option("--json", "as_json", is_flag=True)
    def boom(as_json: bool) -> None:
        raise error("what went wrong; what to change")

    cli.add_command(boom)
    try:
        assert run(["boom", "--json"]) == code
    finally:
        cli.commands.pop("boom")
    captured = capsys.readouterr()
    assert captured.out == ""
    doc = json.loads(captured.err)
    assert doc == {"error": {"kind": kind, "message": "what went wrong; what to change", "exit_code": code}}
    assert EXIT_KINDS[code] == kind


def test_with_json_a_usage_error_from_click_is_json_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["session", "status", "--json", "--no-such-flag"]) == 2
    doc = json.loads(capsys.readouterr().err)
    assert doc["error"]["kind"] == "usage" and "no-such-flag" in doc["error"]["message"]


def test_root_help_documents_every_exit_code_and_kind() -> None:
    out = " ".join(CliRunner().invoke(cli, ["--help"]).output.split())  # click re-wraps the epilog
    for code, text in EXIT_CODES.items():
        assert f"{code} {' '.join(text.split())}" in out
    assert '{"error": {"kind", "message", "exit_code"}}' in out
    docs = CLI_DOCS.read_text()
    for code, kind in EXIT_KINDS.items():
        assert f"| {code} | `{kind}` |" in docs


def test_unknown_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--no-such-flag"]) == 2
    assert "no-such-flag" in capsys.readouterr().err
    assert run(["no-such-command"]) == 2


@pytest.mark.parametrize(("name", "command"), ALL_COMMANDS, ids=[n for n, _ in ALL_COMMANDS])
def test_every_command_has_help_and_a_docs_entry(name: str, command: click.Command) -> None:
    assert (command.help or "").strip(), f"{name} has no help text: give it a docstring"
    assert f"`{name}`" in CLI_DOCS.read_text(), f"{name} is missing from docs/cli.md: run scripts/gen-cli-docs"
    args = [*name.split()[1:], "--help"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_cli_docs_are_current() -> None:
    env = {**os.environ, "CALQUE_VENV_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(REPO / "scripts" / "gen-cli-docs"), "--check"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr + " (run scripts/gen-cli-docs and commit docs/cli.md)"


RESEARCHER_COMMANDS = [
    ["session", "checkout"],
    ["session", "checkin"],
    ["session", "status"],
    ["session", "list"],
    ["pool", "status"],
    ["pool", "results"],
]


@pytest.mark.parametrize("command", RESEARCHER_COMMANDS, ids=[" ".join(c) for c in RESEARCHER_COMMANDS])
def test_researcher_commands_start_without_heavy_libraries(command: list[str]) -> None:
    """What makes start-up slow is never loaded before a command runs (bench/cli_startup.py has the times)."""
    probe = (
        "import sys; from calque.cli.main import run; code = run(sys.argv[1:]); "
        "heavy = ('pydantic', 'boto3', 'botocore', 'rich', 'yaml', 'calque.models.pool', 'calque.models.acquire'); "
        "print(sorted(m for m in heavy if m in sys.modules)); sys.exit(code)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, *command, "--help"], capture_output=True, text=True, timeout=HANG_S, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
