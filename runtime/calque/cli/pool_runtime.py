"""``calque pool stage-runtime``: this calque's wheel and pinned wheelhouse staged in a pool's bucket."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from calque.cli.options import (
    WHOLE_DURATION,
    aws_options,
    bucket_option,
    json_option,
    prefix_option,
    wheelhouse_target_options,
)
from calque.cli.output import progress_to_stderr
from calque.errors import UsageError

if TYPE_CHECKING:
    from calque.ops.outcome import Outcome


def _render_staged(o: Outcome[Any]) -> str:
    r = o.result
    state = "uploaded" if r.uploaded else "already staged"
    lines = [f"s3://{r.bucket}/{r.key} ({state})", f"sha256 {r.sha256}", str(r.url)]
    if r.wheelhouse_key:
        lines += [f"s3://{r.bucket}/{r.wheelhouse_key}", f"sha256 {r.wheelhouse_sha256}", str(r.wheelhouse_url)]
    return "\n".join(lines)


@click.command("stage-runtime")
@bucket_option
@prefix_option
@click.option(
    "--ttl",
    type=WHOLE_DURATION,
    default="3h",
    show_default=True,
    help="How long the instances may download it (their TTL): seconds or 90m, 3h, 1d; at most 7 days.",
)
@click.option(
    "--wheel",
    "wheel_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Stage this calque wheel instead of building the running calque's.",
)
@click.option(
    "--wheelhouse",
    "wheelhouse_path",
    default=None,
    type=click.Path(file_okay=False),
    help="Stage this wheelhouse (`calque runtime wheelhouse`) instead of building one.",
)
@click.option(
    "--no-wheelhouse",
    is_flag=True,
    help="Stage the wheel alone: instances then take calque's dependencies from their own index, unpinned.",
)
@wheelhouse_target_options
@aws_options
@json_option
def stage_runtime(
    bucket: str | None,
    prefix: str,
    ttl: int,
    wheel_path: str | None,
    wheelhouse_path: str | None,
    no_wheelhouse: bool,
    python_version: str | None,
    platform: str | None,
    region: str | None,
    endpoint_url: str | None,
    profile: str | None,
    as_json: bool,
) -> None:
    """Stage this calque's wheel and pinned wheelhouse in the pool's bucket (<prefix>/runtime/), with presigned URLs.

    Uploads only what changed (sha256 in the object's metadata). Pass the URLs and sha256s to
    `calque pool user-data` (--wheelhouse-url/--wheelhouse-sha256, or --runtime-url/--runtime-sha256
    for the wheel alone): instances download, check and install exactly the pinned versions.
    """
    from calque.cli.outcome_view import emit_outcome
    from calque.ops.base import AwsSession
    from calque.ops.runtime import RuntimeOp

    if not bucket:
        raise UsageError("no bucket: pass --bucket or set CALQUE_POOL_BUCKET to the pool's S3 bucket")
    if no_wheelhouse and wheelhouse_path:
        raise UsageError("--wheelhouse and --no-wheelhouse contradict each other: pass one")
    op = RuntimeOp(AwsSession(region=region, endpoint_url=endpoint_url, profile=profile), progress_to_stderr)
    request = op.request(
        {
            "bucket": bucket,
            "prefix": prefix,
            "ttl": str(ttl),
            "wheel": wheel_path,
            "wheelhouse": not no_wheelhouse,
            "wheelhouse_dir": wheelhouse_path,
            "python_version": python_version,
            "platform": platform,
        }
    )
    emit_outcome(op.run(request), as_json, _render_staged)
