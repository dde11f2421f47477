"""``calque pool scaling``: a named pool's scaling on its queue, as ``calque.gpu.pool_scaling`` sets it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from calque.cli.options import DURATION, WHOLE_DURATION, aws_options, json_option

if TYPE_CHECKING:
    from calque.ops.outcome import Outcome


def _render(o: Outcome[Any]) -> str:
    r = o.result
    target = "-" if r.target_backlog_per_instance is None else str(r.target_backlog_per_instance)
    return (
        f"group {r.group_name}  target {target} claims per instance\n"
        f"policies {', '.join(r.policies) or '-'}\nalarms {', '.join(r.alarms) or '-'}\n"
        f"lifecycle hooks {', '.join(r.lifecycle_hooks) or '-'}"
    )


@click.command()
@click.option("--pool", required=True, help="The pool's name (lab-a/embedder).")
@click.option("--state", type=click.Choice(["present", "absent"]), default="present", show_default=True)
@click.option("--seconds-per-claim", type=DURATION, default=None, help="Measured: seconds one claim takes (12.5, 2m).")
@click.option("--latency", "latency_s", type=DURATION, default=None, help="How long a claim may wait (300, 5m).")
@click.option("--idle", "idle_s", type=WHOLE_DURATION, default=900, show_default=True, help="Idle time before zero.")
@click.option("--warmup", "warmup_s", type=WHOLE_DURATION, default=300, show_default=True, help="Instance warm-up.")
@click.option(
    "--drain-timeout", "drain_timeout_s", type=WHOLE_DURATION, default=300, show_default=True, help="Drain hook wait."
)
@click.option("--buffer", type=click.IntRange(0, 1000), default=0, show_default=True, help="Idle instances kept.")
@click.option("--check", is_flag=True, help="Show what would change, change nothing.")
@aws_options
@json_option
def scaling(
    check: bool, region: str | None, endpoint_url: str | None, profile: str | None, as_json: bool, **options: Any
) -> None:
    """Scale a pool's Auto Scaling group on its backlog per instance, to zero and back (as calque.gpu.pool_scaling).

    The target is max(1, floor(latency / seconds-per-claim)) claims per in-service instance.
    """
    from calque.cli.outcome_view import emit_outcome
    from calque.ops.base import AwsSession
    from calque.ops.pool_scaling import PoolScalingOp

    op = PoolScalingOp(AwsSession(region=region, endpoint_url=endpoint_url, profile=profile))
    emit_outcome(op.run(op.request(options), check_mode=check), as_json, _render)
