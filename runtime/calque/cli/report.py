"""``calque report``: GPU-hours and what they cost, at EC2 rates and at Modal's price, by lab, user,
pool or profile; ``calque budget``: the labs' months against their budgets, and an admin's override.

One host's usage comes from its daemon (``--socket``), the institution's through the broker
(``--institution``: every host's last answer, a host that is down marked stale), a pool's from AWS
(``--pool-spec``: its workers' Summaries and its instances' usage records, checked against its group's
activity history; ``--reconcile`` adds Cost Explorer's bill for its ``calque:pool`` tag).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

import click

from calque.cli.options import json_option
from calque.cli.output import emit, table, warn
from calque.cli.session import socket_option
from calque.cli.session_front import broker_socket_option
from calque.timefmt import utc_moment

if TYPE_CHECKING:
    from calque.ledger.pool_usage import PoolLedger
    from calque.models.ledger import HostLedger, LabSpend, LedgerKey, Reconciliation
    from calque.models.reservation import OccurrenceUse
    from calque.session.client.connection import SessionClient

BY = ("lab", "user", "pool", "profile", "host", "source")


@click.command()
@click.option("--by", type=click.Choice(BY), default="lab", show_default=True, help="What a row is.")
@click.option("--since", default="30d", show_default=True, help="How far back, e.g. 24h or 30d.")
@json_option
@click.option("--csv", "as_csv", is_flag=True, help="Print the rows as CSV.")
@socket_option
@click.option("--institution", is_flag=True, help="Every host of the institution, through the broker.")
@broker_socket_option
@click.option(
    "--pool-spec",
    "pool_specs",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Add a named pool's usage (its Summaries and its instances' usage records in S3); repeatable.",
)
@click.option("--no-sessions", is_flag=True, help="Pools only: ask no session daemon.")
@click.option(
    "--reconcile",
    is_flag=True,
    help="Beside each --pool-spec pool, Cost Explorer's bill for its calque:pool tag over the same whole days.",
)
def report(
    by: str,
    since: str,
    as_json: bool,
    as_csv: bool,
    socket_path: Path,
    institution: bool,
    broker_socket: Path,
    pool_specs: tuple[Path, ...],
    no_sessions: bool,
    reconcile: bool,
) -> None:
    """GPU-hours, $ at EC2 rates, $ at Modal's per-second price and their ratio (yours only unless you are an admin)."""
    from calque.durations import parse_duration
    from calque.ledger.report import build_report, render_csv, render_table

    if as_json and as_csv:
        raise click.UsageError("pass --json or --csv, not both")
    if reconcile and not pool_specs:
        raise click.UsageError("--reconcile compares pools: name them with --pool-spec")
    until = time.time()
    start = until - parse_duration(since, what="--since")
    hosts: list[HostLedger] = []
    if institution:
        hosts = _institution(broker_socket, since)
    elif not no_sessions:
        hosts = [_client(socket_path).ledger(since)]
    pools, warnings, reconciled = [], [], []
    for p in pool_specs:
        name, taken_at, ledger, rec = _pool(p, start, until, reconcile)
        pools.append((name, taken_at, ledger.events))
        warnings += ledger.disagreements
        reconciled += [rec] if rec is not None else []
    r = build_report(cast("LedgerKey", by), utc_moment(start), utc_moment(until), hosts, pools)
    occurrences = _occurrences(broker_socket, since) if institution else []
    r = r.model_copy(update={"warnings": warnings, "reconciled": reconciled, "reservations": occurrences})
    if as_csv:
        click.echo(render_csv(r), nl=False)
    else:
        emit(r, as_json, render_table)


def _client(socket_path: Path) -> SessionClient:
    from calque.session.client.connection import SessionClient

    return SessionClient(socket_path)


def _institution(broker_socket: Path, since: str) -> list[HostLedger]:
    from calque.models.ledger import HostLedger
    from calque.session.client.broker import BrokerClient

    answer = BrokerClient(broker_socket).call("ledger", {"since": since})
    return [HostLedger.model_validate(h) for h in answer]


def _occurrences(broker_socket: Path, since: str) -> list[OccurrenceUse]:
    """Each class reservation's occurrences over the window: what its lab's members used, what went back."""
    from calque.errors import CalqueError
    from calque.models.reservation import ReservationView
    from calque.session.client.broker import BrokerClient

    try:
        views = BrokerClient(broker_socket).call("reservations", {"since": since})
    except CalqueError as exc:  # e.g. a broker older than reservations' usage: the hosts' rows alone
        warn(f"no reservations' usage from the broker: {exc}")
        return []
    return sorted((o for v in views for o in ReservationView.model_validate(v).past), key=lambda o: o.start)


def _pool(
    path: Path, start: float, until: float, reconcile: bool
) -> tuple[str, datetime, PoolLedger, Reconciliation | None]:
    from calque.ledger.events import Window
    from calque.ledger.pool_usage import spec_usage
    from calque.ledger.reconcile import reconcile_spec
    from calque.pool.spec import load_spec

    spec = load_spec(path)
    ledger = spec_usage(spec, Window(start, until))
    rec = reconcile_spec(spec, Window(start, until)) if reconcile else None
    return spec.pool or spec.model, utc_moment(until), ledger, rec


@click.group()
def budget() -> None:
    """The labs' monthly budgets (institution.yaml's labs, from calque_labs)."""


def _render_spend(rows: list[LabSpend]) -> str:
    if not rows:
        return "no lab has a budget (calque_labs.<lab>.budget in inventory)"
    return table(
        ["LAB", "MONTH", "GPU-HOURS", "EC2 $", "BUDGET", "USED", "STATE"],
        [
            [
                s.lab,
                s.month,
                f"{s.gpu_hours:.2f}",
                f"{s.ec2_usd:.2f}",
                f"{s.limit:g}{f'+{s.extra:g}' if s.extra else ''} {s.unit}",
                "-" if s.used is None else f"{s.used:.0%}",
                s.state,
            ]
            for s in rows
        ],
    )


@budget.command("status")
@json_option
@socket_option
def budget_status(as_json: bool, socket_path: Path) -> None:
    """Each budgeted lab's month to date on this host, and whether its members are refused."""
    rows = _client(socket_path).ledger("1s").budgets
    if as_json:
        from calque.cli.output import to_json

        click.echo(to_json([r.model_dump(mode="json") for r in rows]))
    else:
        click.echo(_render_spend(rows))


@budget.command("override")
@click.argument("lab")
@click.option("--extra", type=float, required=True, help="More of the budget's unit this month (GPU-hours or USD).")
@click.option("--reason", required=True, help="Why (written to the audit trail).")
@json_option
@socket_option
def budget_override(lab: str, extra: float, reason: str, as_json: bool, socket_path: Path) -> None:
    """Grant LAB more of its budget this month (root or the admin group; audited)."""
    spend = _client(socket_path).budget_override(lab, extra, reason)
    emit(spend, as_json, lambda s: _render_spend([s]))
