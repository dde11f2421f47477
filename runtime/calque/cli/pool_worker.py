"""``calque pool worker``: serve a pool from its spec (one worker, or ``workers: N`` child processes).

Its own module, imported alone by a worker process (``python -m calque.pool --spec FILE``, what
``calque.pool.process.start_worker_process`` starts): a worker loads this command and
``calque.pool.process``, not the rest of the CLI; ``calque.exits`` turns its errors into exit codes.
"""

from __future__ import annotations

import click

from calque.cli.options import DURATION
from calque.errors import InfrastructureError, PartialFailure


@click.command()
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False), help="PoolSpec file (YAML).")
@click.option("--index", type=int, default=None, help="Run only worker N of the spec (systemd template units).")
@click.option("--idle-timeout", type=DURATION, default=None, help="Override: exit after this long idle (600, 10m).")
@click.option("--metrics-port", type=int, default=None, help="Override: serve Prometheus metrics on PORT.")
@click.option("--metrics-addr", default=None, help="Override: the address the metrics port binds (default 127.0.0.1).")
@click.option("--metrics-textfile", default=None, help="Override: write metrics to this node_exporter .prom file.")
@click.option("--instance-type", default=None, help="Override: the EC2 instance type (for the cost line).")
@click.option("--imds-endpoint", default=None, help="Override: the instance metadata service address.")
def worker(
    spec_path: str,
    index: int | None,
    idle_timeout: float | None,
    metrics_port: int | None,
    metrics_addr: str | None,
    metrics_textfile: str | None,
    instance_type: str | None,
    imds_endpoint: str | None,
) -> None:
    """Serve a pool: enter once, then claim, run and summarise until SIGTERM, a spot notice or idle.

    With ``workers: N`` in the spec and no --index, starts N worker processes, one per
    CUDA_VISIBLE_DEVICES entry, and forwards signals to them.
    """
    from calque.pool.process import run_worker, run_workers
    from calque.pool.spec import load_spec

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
