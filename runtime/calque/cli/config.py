"""``calque config``: check the files calque's services read, the way they read them."""

from __future__ import annotations

import click

from calque.cli.options import json_option
from calque.cli.output import emit
from calque.ops.configcheck import KINDS, ConfigCheck, ConfigKind, check_config


@click.group()
def config() -> None:
    """Configuration files of a host: check one before installing it."""


def _render(result: ConfigCheck) -> str:
    facts = ", ".join(f"{k}={v}" for k, v in result.summary.items() if v not in (None, [], ""))
    return f"ok: {result.kind} configuration {result.path}" + (f" ({facts})" if facts else "")


@config.command("check")
@click.argument("kind", type=click.Choice(KINDS))
@click.argument("path")
@click.option("--file-only", is_flag=True, help="Check the file alone, not against this host's GPUs.")
@click.option(
    "--institution",
    "institution",
    default=None,
    type=click.Path(dir_okay=False),
    help="session, broker: the institution file to check it with (default: the one it names); the roles pass "
    "the one they are about to install.",
)
@json_option
def check(kind: ConfigKind, path: str, file_only: bool, institution: str | None, as_json: bool) -> None:
    """Load PATH as KIND exactly as its service will: host (/etc/calque/host.yaml), session
    (/etc/calque/session.yaml) or pool (a PoolSpec); - reads standard input. A session file is also
    checked against this host as the daemon starts (GPU count, MIG mode, MPS slots per GPU) unless
    --file-only. A session or broker file is checked with its institution file (--institution, else the
    one it names; not with --file-only alone): that file loads, a session daemon listening on TCP is one
    of its hosts on the same port, a broker listening on TCP is on its broker port. Exit 2 names every bad field;
    the calque.gpu roles run this before installing a file.
    """
    emit(check_config(kind, path, against_host=not file_only, institution=institution), as_json, _render)
