"""``calque session drain`` and ``undrain``: take a host, or one of its GPUs, out of service without
ending anyone's session (root and the admin group only, as the host's daemon decides).

HOST left out, or this machine's own name: the local daemon through its socket. Any other HOST of
``institution.yaml``: its daemon over TCP, with a munge credential this very process makes, so the
host knows the caller by uid and decides by its own groups whether they may drain it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from calque.cli.options import path_option
from calque.cli.output import emit, table
from calque.timefmt import utc_text

if TYPE_CHECKING:
    from calque.models.session import Drain, Drained

institution_option = path_option(
    "--institution",
    "institution_path",
    envvar="CALQUE_INSTITUTION",
    default="/etc/calque/institution.yaml",
    help="The institution file naming the other hosts (for HOST other than this one).",
)
munge_option = path_option(
    "--munge-socket",
    "munge_socket",
    envvar="CALQUE_MUNGE_SOCKET",
    default=None,
    help="munged's socket (default: munge's own) for HOST other than this one.",
)


def _call(host: str | None, op: str, args: dict[str, Any], socket_path: Path, inst: Path, munge: Path | None) -> Any:
    from calque.session.client.host_route import call_on_host  # on use: `calque session --help` stays light

    return call_on_host(host, op, args, socket_path=socket_path, institution=inst, munge_socket=munge)


def render_drained(d: Drained) -> str:
    lines = [d.drain.describe()]
    if not d.sessions:
        lines.append("no live session there: nothing to wait for")
    for s in d.sessions:
        moved = " (moved in by the drain)" if s.id in d.shortened else ""
        lines.append(
            f"  session {s.id} of {s.user} on {s.slice_id} (gpu {s.gpu_index}) ends {utc_text(s.expires_at)}{moved}"
        )
    return "\n".join(lines)


def render_drains(ds: list[Drain]) -> str:
    if not ds:
        return "nothing is drained"
    rows = [
        ["host" if d.gpu is None else d.gpu, d.by_user, utc_text(d.since), utc_text(d.deadline), d.reason] for d in ds
    ]
    return table(["GPU", "BY", "SINCE", "SESSIONS END BY", "REASON"], rows)


def add_to(session: click.Group, socket_option: click.decorators.FC) -> None:
    """Register ``drain``, ``undrain`` and ``drains`` on the ``session`` group."""

    def reach_host(f: Callable[..., None]) -> Callable[..., None]:
        """--json, and how HOST is reached: this host's socket, or the institution's hosts with munge."""
        f = socket_option(institution_option(munge_option(f)))
        return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(f)

    @session.command()
    @click.argument("host", required=False)
    @click.option("--gpu", type=click.IntRange(0, 1023), default=None, help="Drain this GPU index only.")
    @click.option("--by", default=None, help="Live sessions there end this soon, e.g. 2h (after a notice).")
    @click.option("--reason", required=True, help="Why: shown to everyone refused a checkout there.")
    @reach_host
    def drain(
        host: str | None,
        gpu: int | None,
        by: str | None,
        reason: str,
        as_json: bool,
        socket_path: Path,
        institution_path: Path,
        munge_socket: Path | None,
    ) -> None:
        """No new checkouts on HOST (or its GPU N); live sessions run to their deadline, or with --by
        end by then after a notice (root and the admin group only)."""
        from calque.models.session import DrainArgs, Drained
        from calque.session.client.connection import typed

        args = typed(DrainArgs, gpu=gpu, by=by, reason=reason).model_dump(exclude_none=True)
        answer = _call(host, "drain", args, socket_path, institution_path, munge_socket)
        emit(Drained.model_validate(answer), as_json, render_drained)

    @session.command()
    @click.argument("host", required=False)
    @click.option("--gpu", type=click.IntRange(0, 1023), default=None, help="Undrain this GPU only (default: all).")
    @reach_host
    def undrain(
        host: str | None,
        gpu: int | None,
        as_json: bool,
        socket_path: Path,
        institution_path: Path,
        munge_socket: Path | None,
    ) -> None:
        """Checkouts on HOST (or its GPU N) again: ends its drains (root and the admin group only)."""
        from calque.models.session import Drain

        args = {} if gpu is None else {"gpu": gpu}
        ended = [
            Drain.model_validate(d) for d in _call(host, "undrain", args, socket_path, institution_path, munge_socket)
        ]
        emit(
            ended,
            as_json,
            lambda ds: "undrained: " + ("; ".join(d.describe() for d in ds) if ds else "nothing was drained"),
        )

    @session.command()
    @click.argument("host", required=False)
    @reach_host
    def drains(
        host: str | None, as_json: bool, socket_path: Path, institution_path: Path, munge_socket: Path | None
    ) -> None:
        """HOST's drains (this host's when left out): which GPU, who, since when, why."""
        from calque.models.session import Drain

        ds = [Drain.model_validate(d) for d in _call(host, "drains", {}, socket_path, institution_path, munge_socket)]
        emit(ds, as_json, render_drains)
