"""A pool worker process's command line: ``python -m calque.pool.worker --spec FILE [--index N] [overrides]``.

What systemd (the ``pool_worker`` role's unit, the user-data's) and ``start_worker_process`` run. It
reads its flags with argparse and never loads click or ``cli/``: a worker's start-up is the spec, the
workload and this room. ``calque pool worker`` (``cli/pool_worker.py``) takes the same flags and calls
the same ``serve``. Errors end as the ``calque`` command's do: ``calque: error: ...`` and the exit code
of ``calque.errors.EXIT_CODES``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from calque.durations import DurationError, parse_duration
from calque.errors import CalqueError, InfrastructureError, PartialFailure, refused_for

PROG = "python -m calque.pool.worker"


def serve(
    spec_path: str,
    index: int | None = None,
    *,
    idle_timeout: float | None = None,
    metrics_port: int | None = None,
    metrics_addr: str | None = None,
    metrics_textfile: str | None = None,
    instance_type: str | None = None,
    imds_endpoint: str | None = None,
) -> None:
    """Serve a pool: enter once, then claim, run and summarise until SIGTERM, a spot notice or idle.

    With ``workers: N`` in the spec and no ``index``, starts N worker processes, one per
    CUDA_VISIBLE_DEVICES entry, and forwards signals to them.
    """
    from calque.pool.spec import load_spec
    from calque.pool.worker.worker_process import run_worker, run_workers

    spec = load_spec(
        spec_path,
        idle_timeout_s=idle_timeout,
        metrics_port=metrics_port,
        metrics_addr=metrics_addr,
        metrics_textfile=metrics_textfile,
        instance_type=instance_type,
        imds_endpoint=imds_endpoint,
    )
    if index is None and spec.workers > 1:
        # flags override the spec in every child, as in this process (each child reads the spec file again)
        given = {
            "--idle-timeout": None if idle_timeout is None else f"{idle_timeout:g}",
            "--metrics-port": metrics_port,
            "--metrics-addr": metrics_addr,
            "--metrics-textfile": metrics_textfile,
            "--instance-type": instance_type,
            "--imds-endpoint": imds_endpoint,
        }
        flags = [part for flag, value in given.items() if value is not None for part in (flag, str(value))]
        codes = run_workers(spec_path, spec, extra_args=flags)
        if any(codes) and all(c in (0, InfrastructureError.exit_code) for c in codes):
            # every failed child could not load (or reach AWS): exit as they did, so systemd backs off alike
            raise InfrastructureError(f"worker exit codes {codes}: see each worker's load record (calque pool status)")
        if any(codes):
            raise PartialFailure(f"worker exit codes {codes}")
        return
    rep = run_worker(spec, index=index)
    if rep.exit_errors:
        raise PartialFailure(f"@exit hooks failed: {'; '.join(rep.exit_errors)}")


def _duration(value: str) -> float:
    try:
        return parse_duration(value, what="--idle-timeout")
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=(serve.__doc__ or "").split("\n")[0])
    p.add_argument("--spec", dest="spec_path", required=True, help="PoolSpec file (YAML).")
    p.add_argument("--index", type=int, default=None, help="Run only worker N of the spec (systemd template units).")
    p.add_argument(
        "--idle-timeout", type=_duration, default=None, help="Override: exit after this long idle (600, 10m)."
    )
    p.add_argument("--metrics-port", type=int, default=None, help="Override: serve Prometheus metrics on PORT.")
    p.add_argument(
        "--metrics-addr", default=None, help="Override: the address the metrics port binds (default 127.0.0.1)."
    )
    p.add_argument("--metrics-textfile", default=None, help="Override: write metrics to this node_exporter .prom file.")
    p.add_argument("--instance-type", default=None, help="Override: the EC2 instance type (for the cost line).")
    p.add_argument("--imds-endpoint", default=None, help="Override: the instance metadata service address.")
    return p


def _fail(message: str, code: int) -> int:
    print(f"calque: error: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str]) -> int:
    """Run one worker command line and return its exit code: every error becomes one here."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    try:
        serve(**vars(args))
    except CalqueError as exc:
        return _fail(str(exc), exc.exit_code)
    except PermissionError as exc:
        refused = refused_for(exc)
        return _fail(str(refused), refused.exit_code)
    except KeyboardInterrupt:
        return _fail("aborted", 130)
    except Exception as exc:
        from calque.aws.aws_errors import translate_any  # the error path only: start-up stays lean

        aws = translate_any(exc)  # a botocore error no `aws_errors` block caught still reads as a sentence
        if aws is None:
            raise
        return _fail(str(aws), aws.exit_code)
    return 0
