"""The EC2 warm pool's two commands: ``calque pool warm-up`` (on an instance: up to "ready", the warm pool's
launching hook) and ``calque pool prewarm`` (scheduled warmth)."""

from __future__ import annotations

from datetime import datetime, timezone

import click

from calque.cli.options import WHOLE_DURATION, aws_options, json_option


@click.command("warm-up")
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False), help="PoolSpec file (YAML).")
@click.option(
    "--wait-in-service", is_flag=True, help="First wait while the instance is warmed (the worker unit's start)."
)
@json_option
def warm_up(spec_path: str, wait_in_service: bool, as_json: bool) -> None:
    """Bring this instance to "ready" and complete its calque-ready lifecycle hook (user-data and worker unit).

    Downloads the workload, runs its @modal.build() and @modal.enter(snap=True) methods with the
    caches under CALQUE_WEIGHTS_CACHE, writes the ready mark, then completes the hook CONTINUE
    (ABANDON when a step raised). A ready mark for the same workload skips the steps: a start out
    of the warm pool repeats nothing.
    """
    from calque.pool.spec import load_spec
    from calque.pool.worker.instance_ready import warm_up as run

    report = run(load_spec(spec_path), wait_in_service=wait_in_service)
    if as_json:
        click.echo(report.model_dump_json())
        return
    what = "prepared" if report.prepared else "already ready"
    click.echo(
        f"{what}; instance {report.instance_id or '-'} ({report.target_state or 'not in a group'}), "
        f"lifecycle action {report.lifecycle or '-'}, {report.seconds:g}s"
    )


@click.command()
@click.option("--pool", "pool_name", required=True, help="The pool's name (lab-a/embedder).")
@click.option(
    "--at", "at", required=True, type=click.DateTime(["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M"]), help="Start (UTC)."
)
@click.option("--for", "duration", required=True, type=WHOLE_DURATION, help="How long (2h, 90m).")
@click.option("--instances", type=click.IntRange(0, 1000), default=1, show_default=True, help="Minimum meanwhile.")
@click.option("--lead", type=WHOLE_DURATION, default=600, show_default=True, help="How early (10m).")
@aws_options
@json_option
def prewarm(
    pool_name: str,
    at: datetime,
    duration: int,
    instances: int,
    lead: int,
    region: str | None,
    endpoint_url: str | None,
    profile: str | None,
    as_json: bool,
) -> None:
    """Keep a pool's instances in service for one window: two one-off Auto Scaling scheduled actions.

    The group's minimum becomes --instances --lead before --at (UTC) and returns to its own minimum
    --for later. Recurring windows belong in inventory (calque_pool_schedule).
    """
    from calque.aws.acquire.schedule import prewarm_pool

    start = at.replace(tzinfo=timezone.utc)  # click reads a naive time; --at is UTC
    report = prewarm_pool(
        pool_name, start, duration, instances, lead, region=region, endpoint_url=endpoint_url, profile=profile
    )
    if as_json:
        click.echo(report.model_dump_json())
        return
    for name, doc in report.actions.items():
        click.echo(f"{name}: MinSize {doc['MinSize']} at {doc['StartTime']}")
