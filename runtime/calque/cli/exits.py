"""Where errors become exit codes for the ``calque`` command line.

Exit codes (``calque.errors.EXIT_CODES``): 0 success; 1 partial failure or unexpected error; 2 usage;
3 infrastructure; 4 refused by a safety gate; 5 nothing free; 6 the session daemon cannot be reached;
130 aborted. Commands raise ``CalqueError`` subclasses; ``run_command`` maps them. With ``--json`` the
error goes to stderr as ``{"error": {"kind": ..., "message": ..., "exit_code": N}}``. Two command
lines end in exit codes: ``calque`` (``cli.main``), through this module, and a pool worker process
(``python -m calque.pool.worker``, ``calque.pool.worker.entry``), which never loads click or ``cli/``
and maps the same errors by ``calque.errors.refused_for`` and ``calque.aws.aws_errors.translate_any``.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from calque.errors import EXIT_KINDS, CalqueError, refused_for


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


def run_command(command: click.Command, argv: list[str], prog_name: str) -> int:
    """Run ``command`` on ``argv`` and return its exit code: every error becomes one here."""
    as_json = _wants_json(argv)
    try:
        rv = command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except CalqueError as exc:
        return _fail(str(exc), exc.exit_code, as_json)
    except PermissionError as exc:
        refused = refused_for(exc)
        return _fail(str(refused), refused.exit_code, as_json)
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
        from calque.aws.aws_errors import translate_any  # the error path only: start-up stays lean

        aws = translate_any(exc)  # a botocore error no `aws_errors` block caught still reads as a sentence
        if aws is None:
            raise
        return _fail(str(aws), aws.exit_code, as_json)
    return int(rv) if isinstance(rv, int) else 0
