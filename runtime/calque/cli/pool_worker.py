"""``calque pool worker``: serve a pool from its spec (one worker, or ``workers: N`` child processes).

The same flags and the same ``serve`` as a worker process's own entry (``python -m calque.pool.worker``,
``calque.pool.worker.entry``), which systemd and ``start_worker_process`` run without the CLI.
"""

from __future__ import annotations

import click

from calque.cli.options import DURATION


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
    from calque.pool.worker.entry import serve

    serve(
        spec_path,
        index,
        idle_timeout=idle_timeout,
        metrics_port=metrics_port,
        metrics_addr=metrics_addr,
        metrics_textfile=metrics_textfile,
        instance_type=instance_type,
        imds_endpoint=imds_endpoint,
    )
