"""The ``calque`` root command; its errors become exit codes in ``calque.cli.exits`` (the one place).

Exit codes (``calque.errors.EXIT_CODES``): 0 success; 1 partial failure or unexpected error; 2 usage;
3 infrastructure; 4 refused by a safety gate; 5 nothing free; 6 the session daemon cannot be reached;
130 aborted. Commands raise ``CalqueError`` subclasses; ``calque.cli.exits.run_command`` maps them. With ``--json`` the
error goes to stderr as ``{"error": {"kind": ..., "message": ..., "exit_code": N}}``.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from calque import __version__
from calque.cli.exits import run_command
from calque.errors import EXIT_CODES

# pydantic scans every installed distribution's entry points for plugins when it builds its first
# model (importlib.metadata: a quarter of `calque session status`'s imports); calque uses none.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

# Verb groups load on first use: `eval "$(calque session checkout --shell)"` should not pay for boto3.
_VERBS = {
    "config": "calque.cli.config:config",
    "pool": "calque.cli.pool:pool",
    "session": "calque.cli.session:session",
    "gpu": "calque.cli.gpu:gpu",
    "ramp": "calque.cli.ramp:ramp",
    "run": "calque.cli.run:run",
    "runtime": "calque.cli.runtime:runtime",
    "report": "calque.cli.report:report",
    "budget": "calque.cli.report:budget",
}

_EPILOG = (
    "Exit codes:\n\n"
    + "\n\n".join(f"  {code}  {text}" for code, text in EXIT_CODES.items())
    + '\n\nWith --json, an error is printed to stderr as {"error": {"kind", "message", "exit_code"}}.'
)


class _LazyGroup(click.Group):
    """A group whose subcommands are imported only when named (or when help lists them)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *_VERBS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _VERBS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, attr = target.split(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command


@click.group(cls=_LazyGroup, epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="calque")
def cli() -> None:
    """Share institutional GPU capacity on AWS: warm pools, MIG slices and MPS slots."""


def run(args: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (tests call this; ``main`` exits with it)."""
    return run_command(cli, list(sys.argv[1:] if args is None else args), "calque")


def main() -> None:
    sys.exit(run())
