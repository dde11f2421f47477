"""The ``calque`` root command and the ONLY place where errors become exit codes.

Exit codes (``calque.errors.EXIT_CODES``): 0 success; 1 partial failure or unexpected error; 2 usage;
3 infrastructure; 4 refused by a safety gate; 5 nothing free; 6 the session daemon cannot be reached;
130 aborted. Commands raise ``CalqueError`` subclasses; ``run`` maps them here. With ``--json`` the
error goes to stderr as ``{"error": {"kind": ..., "message": ..., "exit_code": N}}``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

import click

from calque import __version__
from calque.errors import EXIT_CODES, EXIT_KINDS, CalqueError, RefusedError

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


def _wants_json(args: Sequence[str]) -> bool:
    """Whether the command line asks for ``--json`` (read from the arguments, so that an error raised
    while click is still parsing them is JSON too)."""
    for arg in args:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def _fail(message: str, code: int, as_json: bool) -> int:
    if as_json:
        import json  # only on the error path: start-up stays lean

        error = {"kind": EXIT_KINDS.get(code, "failure"), "message": message, "exit_code": code}
        click.echo(json.dumps({"error": error}), err=True)
    else:
        click.echo(f"calque: error: {message}", err=True)
    return code


def run(args: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (tests call this; ``main`` exits with it)."""
    argv = list(sys.argv[1:] if args is None else args)
    as_json = _wants_json(argv)
    try:
        rv = cli.main(args=argv, prog_name="calque", standalone_mode=False)
    except CalqueError as exc:
        return _fail(str(exc), exc.exit_code, as_json)
    except PermissionError as exc:
        # A file or device this user may not open is a sentence, never a traceback (exit 4, refused).
        where = f" on {exc.filename}" if exc.filename else ""
        why = f"permission denied{where} ({exc.strerror or exc}): run it as a user who may (often root, via sudo)"
        return _fail(why, RefusedError.exit_code, as_json)
    except click.exceptions.Abort:
        if as_json:
            return _fail("aborted", 130, as_json)
        click.echo("calque: aborted", err=True)
        return 130
    except click.ClickException as exc:
        code = 2 if isinstance(exc, click.UsageError) else exc.exit_code
        if as_json:
            return _fail(exc.format_message(), code, as_json)
        exc.show()
        return code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except Exception as exc:
        from calque.aws.errors import translate_any  # the error path only: start-up stays lean

        aws = translate_any(exc)  # a botocore error no `aws_errors` block caught still reads as a sentence
        if aws is None:
            raise
        return _fail(str(aws), aws.exit_code, as_json)
    return int(rv) if isinstance(rv, int) else 0


def main() -> None:
    sys.exit(run())
