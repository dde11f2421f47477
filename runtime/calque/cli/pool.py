"""``calque pool ...``: warm pools: submit runs, read results, run workers, look at queues."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from calque.cli.options import aws_options, json_option
from calque.cli.pool_runs import results, submit, sweep
from calque.cli.pool_scaling import scaling
from calque.cli.pool_status import status
from calque.cli.pool_worker import worker

# boto3, the pool models and pydantic load when a command runs, not for --help (bench/cli_startup.py).
if TYPE_CHECKING:
    from calque.ops.outcome import Outcome


@click.group()
def pool() -> None:
    """Warm pools: one SQS queue per named pool and resident workers that keep its model loaded."""


for _command in (submit, results, sweep, status, scaling, worker):
    pool.add_command(_command)


def _render_queue(o: Outcome[Any]) -> str:
    r = o.result
    attrs = ", ".join(f"{k}={v}" for k, v in r.attributes.items()) or "-"
    return f"queue {r.queue_name}  url {r.queue_url or '-'}\ndlq {r.dlq_arn or '-'}\nattributes {attrs}"


@pool.command()
@click.option("--model", required=True, help="The pool's model (its identity).")
@click.option("--pool", default=None, help="The pool's name (lab-a/embedder): names and tags the queue.")
@click.option("--state", type=click.Choice(["present", "absent"]), default="present", show_default=True)
@click.option("--visibility-timeout", type=int, default=None, help="Seconds a claim stays invisible (0..43200).")
@click.option("--message-retention", type=int, default=None, help="Seconds SQS keeps a message (60..1209600).")
@click.option("--receive-wait", type=int, default=None, help="Long-poll wait in seconds (0..20).")
@click.option("--max-receive-count", type=int, default=None, help="Receives before the DLQ (1..1000).")
@click.option("--dlq-retention", type=int, default=None, help="Seconds the DLQ keeps a message (60..1209600).")
@click.option("--encryption/--no-encryption", default=None, help="SQS-managed server-side encryption.")
@click.option("--check", is_flag=True, help="Show what would change, change nothing.")
@aws_options
@json_option
def queue(
    check: bool, region: str | None, endpoint_url: str | None, profile: str | None, as_json: bool, **options: Any
) -> None:
    """Create, update or delete a pool's SQS queue and dead-letter queue (as calque.gpu.pool_queue does).

    Settings left out keep an existing queue's values; a new queue gets the defaults.
    """
    from calque.cli.outcome_view import emit_outcome
    from calque.ops.base import AwsSession
    from calque.ops.pool_queue import PoolQueueOp

    op = PoolQueueOp(AwsSession(region=region, endpoint_url=endpoint_url, profile=profile))
    emit_outcome(op.run(op.request(options), check_mode=check), as_json, _render_queue)


@pool.command("user-data")
@click.option("--spec", "spec_path", required=True, help="PoolSpec file (YAML), or - for stdin.")
@click.option(
    "--runtime-url",
    default=None,
    help="Presigned URL of the staged calque wheel (from `calque pool stage-runtime`); needs --runtime-sha256.",
)
@click.option("--runtime-sha256", default=None, help="The staged wheel's sha256, checked on the instance.")
@click.option(
    "--wheelhouse-url",
    default=None,
    help="Presigned URL of the staged wheelhouse (calque and its pinned dependencies); needs --wheelhouse-sha256.",
)
@click.option("--wheelhouse-sha256", default=None, help="The staged wheelhouse's sha256, checked on the instance.")
@click.option(
    "--runtime-pip",
    default=None,
    help="Override: pip requirement or URL that installs calque on the instance (wins over --runtime-url).",
)
@json_option
def user_data(
    spec_path: str,
    runtime_url: str | None,
    runtime_sha256: str | None,
    wheelhouse_url: str | None,
    wheelhouse_sha256: str | None,
    runtime_pip: str | None,
    as_json: bool,
) -> None:
    """Print the EC2 user-data that makes an instance a worker of this pool (systemd unit included).

    playbooks/pool.yml passes it to calque.gpu.ec2_cohort; the spec is validated first. Without
    --runtime-url or --runtime-pip the instance runs `pip install calque==<this version>`, which
    needs an index that has calque. With --wheelhouse-url the instance installs calque and exactly
    the dependency versions in constraints.txt from the staged wheelhouse, with no index.
    """
    from calque.cli.outcome_view import emit_outcome
    from calque.ops.pool_spec import PoolSpecOp, PoolSpecRequest
    from calque.pool.spec import load_spec

    request = PoolSpecRequest(
        spec=load_spec(spec_path).model_dump(mode="json"),
        stage_runtime=False,
        runtime_pip=runtime_pip or None,
        runtime_url=runtime_url or None,
        runtime_sha256=runtime_sha256 or None,
        wheelhouse_url=wheelhouse_url or None,
        wheelhouse_sha256=wheelhouse_sha256 or None,
    )
    outcome = PoolSpecOp().run(request)
    if as_json:
        emit_outcome(outcome, as_json)
    else:  # the human view is the script itself, to pipe or save
        click.echo(outcome.result.user_data, nl=False)


# Verbs in their own files (each file under a few hundred lines).
from calque.cli.pool_iam import iam_policy  # noqa: E402
from calque.cli.pool_list import pool_list  # noqa: E402
from calque.cli.pool_runtime import stage_runtime  # noqa: E402
from calque.cli.pool_warmth import prewarm, warm_up  # noqa: E402

for _command in (pool_list, stage_runtime, iam_policy, warm_up, prewarm):
    pool.add_command(_command)
