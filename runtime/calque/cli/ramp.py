"""``calque ramp``: acquire one instance, run one warm pool worker on it, submit a ramp of item counts."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

import click

from calque.cli.options import DURATION, WHOLE_DURATION, aws_options, json_option, spend_consent_option
from calque.cli.output import emit, table
from calque.errors import PartialFailure
from calque.models.acquire import RampReport, RampRung

_HEADERS = ["rung", "items", "ok", "failed", "wall s", "items/s", "enter s paid"]


def _row(r: RampRung) -> list[Any]:
    return [r.rung, r.items, r.ok, r.failed, f"{r.wall_s:.3f}", f"{r.items_per_s:.1f}", f"{r.enter_seconds_paid:.3f}"]


def _render(rep: RampReport) -> str:
    inst = rep.instance
    where = f"{inst.instance_id} ({inst.instance_type}, {inst.availability_zone}, {inst.lifecycle})" if inst else "-"
    lines = [
        f"workload {rep.workload}  method {rep.method}  instance {where}  ${rep.hourly_usd:.4f}/h",
        table(_HEADERS, [_row(r) for r in rep.rungs]),
        f"@enter ran {rep.enter_count} time(s), {rep.enter_seconds:.3f}s paid in all, by rung 0 only",
        f"terminated: {', '.join(rep.terminated) or '-'}",
    ]
    return "\n".join(lines)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the ramp the way Ctrl-C does, so the instance is terminated either way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@click.command()
@click.option("--workload", required=True, help="Modal-shaped script, optionally script.py::Class.")
@click.option("--rungs", required=True, help="Item counts, one rung each, in order: e.g. 1,100,1000.")
@click.option("--method", default=None, help="Method to call (default: the workload's only method).")
@click.option(
    "--items",
    "items_file",
    type=click.Path(dir_okay=False),
    default=None,
    help='JSONL items ({"args": [...], "kwargs": {...}} or one value per line), reused in turn; '
    "default: item i is called with the one argument i.",
)
@click.option(
    "--bucket",
    envvar="CALQUE_POOL_BUCKET",
    default=None,
    help="S3 bucket for the ramp's runs, under <prefix>/ramps/<id>/ (or CALQUE_POOL_BUCKET).",
)
@click.option("--prefix", default="calque", show_default=True, help="Key prefix in the bucket.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=100, show_default=True, help="Items per claim.")
@click.option("--instance-type", required=True, help="EC2 instance type of the one instance, e.g. g6.xlarge.")
@click.option("--spot", is_flag=True, help="Use a spot instance (gated at the on-demand rate).")
@click.option(
    "--ttl",
    type=WHOLE_DURATION,
    default="3h",
    show_default=True,
    help="Hard lifetime of the instance: 3600, 90m, 1.5h, 1d.",
)
@click.option("--subnet", "subnets", multiple=True, help="Subnet id, in order of preference (repeatable).")
@click.option("--ami", default=None, help="AMI id (default: the AWS Deep Learning Base AMI via SSM).")
@click.option("--ami-ssm-parameter", default=None, help="SSM parameter naming the AMI id.")
@click.option("--root-volume-gib", type=int, default=100, show_default=True, help="Root volume size (encrypted).")
@click.option(
    "--instance-profile", default=None, help="IAM instance profile (name or ARN) for the worker's SQS/S3 access."
)
@click.option("--security-group", "security_groups", multiple=True, help="Security group id (repeatable).")
@click.option(
    "--runtime-pip",
    default=None,
    help="Override: pip requirement or URL that installs calque on the instance (default: this calque's wheel,"
    " staged under the ramp's prefix and downloaded through a presigned URL).",
)
@click.option(
    "--rung-timeout",
    type=DURATION,
    default=3600.0,
    show_default=True,
    help="Seconds one rung may take (rung 0 includes the instance's boot and install).",
)
@click.option("--max-hourly-usd", type=float, default=None, help="Refuse an instance dearer than this per hour.")
@click.option(
    "--wait-timeout",
    type=WHOLE_DURATION,
    default=600,
    show_default=True,
    help="How long to wait for running (600, 10m).",
)
@spend_consent_option
@aws_options
@json_option
def ramp(
    workload: str,
    rungs: str,
    method: str | None,
    items_file: str | None,
    bucket: str | None,
    prefix: str,
    batch_size: int,
    instance_type: str,
    spot: bool,
    ttl: int,
    subnets: tuple[str, ...],
    ami: str | None,
    ami_ssm_parameter: str | None,
    root_volume_gib: int,
    instance_profile: str | None,
    security_groups: tuple[str, ...],
    runtime_pip: str | None,
    rung_timeout: float,
    max_hourly_usd: float | None,
    wait_timeout: int,
    spend_consent: bool,
    region: str | None,
    endpoint_url: str | None,
    profile: str | None,
    as_json: bool,
) -> None:
    """Acquire one instance, run one warm pool worker on it across rungs of item counts, then terminate it.

    The ramp gets a temporary pool queue and S3 prefix; the instance's user-data starts one
    `calque pool worker` (the bootstrap of playbooks/pool.yml) and each rung is submitted as a pool
    run, so only the first rung pays the model load. The instance is terminated and the queue
    deleted at the end, on an error and on Ctrl-C or SIGTERM. Offline (CALQUE_OFFLINE=1) a local
    worker process on the same spec stands in for the instance's.
    """
    from calque.aws.acquire import Acquirer, Consent
    from calque.pool.submitter.ramp import RampOptions, parse_rungs, run_ramp

    opts = RampOptions(
        workload=workload,
        rungs=parse_rungs(rungs),
        instance_type=instance_type,
        method=method,
        items_file=items_file,
        bucket=bucket or "",
        prefix=prefix,
        batch_size=batch_size,
        spot=spot,
        ttl_seconds=ttl,
        subnets=list(subnets),
        ami=ami,
        ami_ssm_parameter=ami_ssm_parameter,
        root_volume_gib=root_volume_gib,
        instance_profile=instance_profile,
        security_groups=list(security_groups),
        runtime_pip=runtime_pip,
        rung_timeout_s=rung_timeout,
        max_hourly_usd=max_hourly_usd,
        wait_timeout_s=wait_timeout,
        region=region,
        endpoint_url=endpoint_url,
        profile=profile,
    )

    def say(msg: str) -> None:
        click.echo(f"ramp: {msg}", err=True)

    def show_rung(r: RampRung) -> None:
        if not as_json:
            click.echo(table(_HEADERS, [_row(r)]) + "\n")

    acquirer = Acquirer(region=region, endpoint_url=endpoint_url, profile=profile, progress=say)
    with _sigterm_as_interrupt():
        report = run_ramp(opts, acquirer, Consent(spend=spend_consent), progress=say, on_rung=show_rung)
    emit(report, as_json, _render)
    failed = sum(r.failed for r in report.rungs)
    if failed:
        raise PartialFailure(f"{failed} item(s) failed across the ramp; see the ok/failed columns")
