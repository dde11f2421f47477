"""``calque run SCRIPT``: a Modal script's local entrypoint here, its remote calls on warm pools."""

from __future__ import annotations

from pathlib import Path

import click

from calque.cli.options import DURATION
from calque.errors import UsageError


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("script")
@click.argument("entry_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--pool", "pool", default=None, help="Pool spec file (PoolSpec YAML) serving the script's classes.")
@click.option("--pools", "pools_file", default=None, type=click.Path(dir_okay=False),
              help="Names to pool spec files, or to a list of them, one pool per parameter set (YAML; "
                   "default: calque-run.yaml beside the script).")  # fmt: skip
@click.option("--local", is_flag=True, help="Run every call in this process (no queue, no AWS).")
@click.option("--timeout", type=DURATION, default=3600.0, show_default=True,
              help="How long a call may wait with no claim finishing before it fails (seconds, 90m, 1h).")  # fmt: skip
@click.option("-w", "--write-result", default=None, help="Write the entrypoint's return value (str or bytes) here.")
def run(
    script: str,
    entry_args: tuple[str, ...],
    pool: str | None,
    pools_file: str | None,
    local: bool,
    timeout: float,
    write_result: str | None,
) -> None:
    """Run SCRIPT[::ENTRYPOINT]'s @app.local_entrypoint() here, serving its remote calls from pools.

    Options of calque run come before SCRIPT; everything after it is the entrypoint's own
    arguments (--name value, from its signature, as modal run parses them). .remote() is a
    one-item claim, .map()/.starmap() claims of the pool's batch size streamed back as they finish,
    .spawn() a call whose .get() waits. Exit 0 when the entrypoint returns, 1 when it raises.
    """
    from calque.run.script import run_script

    outcome = run_script(script, list(entry_args), local=local, pool=pool, pools_file=pools_file, timeout_s=timeout)
    for line in outcome.tally.lines(outcome.where):
        click.echo(line, err=True)
    if write_result is not None:
        value = outcome.value
        if not isinstance(value, (str, bytes)):
            got = type(value).__name__
            raise UsageError(f"--write-result needs the entrypoint to return str or bytes, it returned {got}")
        data = value.encode() if isinstance(value, str) else value
        Path(write_result).write_bytes(data)
