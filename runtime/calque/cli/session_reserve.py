"""``calque session reserve`` and ``reservations``: class reservations in the institution's broker
(issue 38). Root, the admin group, or a lab's manager (``institution.yaml``) reserve; anyone lists
them, or exports them as an iCalendar file for a course page."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from calque.cli.output import emit, table
from calque.timefmt import CLOCK, utc_text

if TYPE_CHECKING:
    from calque.models.reservation import ReservationView


def _client(path: Path) -> Any:
    from calque.session.client.broker import BrokerClient

    return BrokerClient.here(path)


def render(views: list[ReservationView]) -> str:
    from calque.durations import format_duration

    if not views:
        return "no reservation"
    rows = []
    for v in views:
        r = v.reservation
        nxt = v.occurrences[0][0] if v.occurrences else None
        every = "weekly" + (f" until {r.until.date().isoformat()}" if r.until else "") if r.weekly else "once"
        rows.append([
            r.name, r.group, r.lab, f"{r.count} x {r.profile}", utc_text(nxt, CLOCK) if nxt else "over",
            format_duration(r.duration_s), every,
            format_duration(r.release_unused_after_s) if r.release_unused_after_s else "",
        ])  # fmt: skip
    out = table(["NAME", "GROUP", "LAB", "SLICES", "NEXT", "FOR", "REPEATS", "RELEASE"], rows)
    return "\n".join([out, *under_way(views)])


def under_way(views: list[ReservationView]) -> list[str]:
    """One line per occurrence under way: what it reserves, what its members use, what is held for
    them and what went back to the queue (``list --all`` shows these too)."""
    return [
        f"{v.reservation.name} now (until {utc_text(v.now.end, CLOCK)}): {v.now.reserved} reserved, "
        f"{v.now.used} used, {v.now.held} held, {v.now.handed_back} handed back"
        + (f", {v.now.short} short (sessions ran into it)" if v.now.short else "")
        for v in views
        if v.now is not None
    ]


def add_to(session: click.Group, broker_socket_option: Callable[[Any], Any]) -> None:
    @session.command()
    @click.option("--name", required=True, help="The reservation's name (what members pass to --reservation).")
    @click.option("--group", required=True, help="The Unix group whose members use it.")
    @click.option("--profile", required=True, help="The MIG profile of its slices, e.g. 1g.24gb.")
    @click.option("--count", type=int, required=True, help="How many slices.")
    @click.option("--at", "at", required=True, help="'tue 14:00', '14:00' or an ISO time; the broker's local time.")
    @click.option("--for", "duration", required=True, help="How long each occurrence lasts, e.g. 2h.")
    @click.option("--weekly", is_flag=True, help="Every week at the same local time.")
    @click.option("--until", default=None, help="With --weekly: the last day (2027-03-31).")
    @click.option("--release-unused-after", default=None, help="Unused slices go back to the queue this far in.")
    @click.option("--lab", default=None, help="The lab charged (default: the lab you manage).")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @broker_socket_option
    def reserve(as_json: bool, broker_socket: Path, **opts: Any) -> None:
        """Reserve slices for a group at fixed times (root, the admin group, or a lab's manager)."""
        from pydantic import ValidationError

        from calque.errors import UsageError
        from calque.models.reservation import ReservationView, ReserveArgs

        try:  # the broker checks it again; a broken rule is a usage error (exit 2) before anything is sent
            args = ReserveArgs.model_validate({k: v for k, v in opts.items() if v is not None and v is not False})
        except ValidationError as exc:
            raise UsageError("; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())) from exc
        view = ReservationView.model_validate(_client(broker_socket).call("reserve", args.model_dump(mode="json")))
        emit(view, as_json, lambda v: render([v]))

    @session.command()
    @click.argument("name", required=False)
    @click.option("--cancel", "cancel", default=None, metavar="NAME", help="Cancel the reservation NAME.")
    @click.option(
        "--ics", "ics", type=click.Path(path_type=Path), default=None, help="Write an iCalendar file ('-': stdout)."
    )
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @broker_socket_option
    def reservations(
        name: str | None, cancel: str | None, ics: Path | None, as_json: bool, broker_socket: Path
    ) -> None:
        """The institution's reservations (NAME: one), their next occurrences and the one under way."""
        from datetime import datetime, timezone

        from calque.models.reservation import ReservationView

        client = _client(broker_socket)
        if cancel is not None:
            done = client.call("unreserve", {"name": cancel})
            emit(done, as_json, lambda d: f"reservation {d['name']} cancelled")
            return
        views = [ReservationView.model_validate(v) for v in client.call("reservations", {"name": name})]
        if ics is not None:
            from calque.session.client.ics import calendar

            text = calendar(views, datetime.now(timezone.utc))
            if str(ics) == "-":
                click.echo(text, nl=False)
            else:
                ics.write_text(text, newline="")
                click.echo(f"wrote {sum(len(v.occurrences) for v in views)} occurrence(s) to {ics}", err=True)
            return
        emit(views, as_json, render)
