"""The ``calque`` root command and the ONLY place where errors become exit codes.

Exit codes: 0 success; 1 partial failure or unexpected error; 2 usage; 3 infrastructure; 4 refused
by a safety gate. Commands raise ``CalqueError`` subclasses; ``main`` maps them here.
"""

from __future__ import annotations

import importlib
import sys

import click

from calque import __version__
from calque.errors import EXIT_CODES, CalqueError

# Verb groups load on first use: `eval "$(calque session checkout --shell)"` should not pay for boto3.
_VERBS = {
    "pool": "calque.cli.pool:pool",
    "session": "calque.cli.session:session",
    "gpu": "calque.cli.gpu:gpu",
    "ramp": "calque.cli.ramp:ramp",
    "run": "calque.cli.run:run",
}

_EPILOG = "Exit codes:\n\n" + "\n\n".join(f"  {code}  {text}" for code, text in EXIT_CODES.items())


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
    try:
        rv = cli.main(args=args, prog_name="calque", standalone_mode=False)
    except CalqueError as exc:
        click.echo(f"calque: error: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("calque: aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return 2 if isinstance(exc, click.UsageError) else exc.exit_code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    return int(rv) if isinstance(rv, int) else 0


def main() -> None:
    sys.exit(run())
