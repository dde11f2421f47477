"""Checking a configuration file exactly as the service that reads it will, before it is installed.

The calque.gpu roles render ``/etc/calque/host.yaml``, ``/etc/calque/session.yaml`` and
``/etc/calque/pool.yml`` and run ``calque config check KIND FILE`` on the host as the template's
``validate:`` step, so a bad inventory value fails the play with the loader's own message and the
installed file is never replaced by one the service would refuse. The summary also carries what a
role needs from the file (a pool worker's shutdown bound for systemd's ``TimeoutStopSec``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from calque.models.base import CalqueModel

ConfigKind = Literal["host", "session", "pool"]
KINDS: tuple[ConfigKind, ...] = ("host", "session", "pool")


class ConfigCheck(CalqueModel):
    """A file that loaded cleanly, and the facts about it a person or a role wants next."""

    kind: ConfigKind
    path: str
    summary: dict[str, Any] = Field(default_factory=dict)


def check_config(kind: ConfigKind, path: str | Path) -> ConfigCheck:
    """Load ``path`` as ``kind`` (``-``: standard input, for ``pool``); a ``UsageError`` says what is wrong."""
    if kind == "host":
        return ConfigCheck(kind=kind, path=str(path), summary=_host(path))
    if kind == "session":
        return ConfigCheck(kind=kind, path=str(path), summary=_session(path))
    return ConfigCheck(kind=kind, path=str(path), summary=_pool(path))


def _host(path: str | Path) -> dict[str, Any]:
    from calque.gpu.hostconfig import load_gpu_config

    cfg = load_gpu_config(path)
    sim = cfg.sim
    return {
        "gpu_backend": cfg.backend,
        "sim_state": str(sim.state) if sim is not None else None,
        "sim_shape": (sim.instance_type or sim.cards) if sim is not None else None,
    }


def _session(path: str | Path) -> dict[str, Any]:
    from calque.session.config import load_config

    cfg = load_config(Path(path))
    return {
        "gpu_backend": cfg.gpu_backend,
        "socket": str(cfg.socket),
        "mps_slots": sum(g.slots for g in cfg.mps),
        "default_ttl_s": cfg.default_ttl,
        "max_total_ttl_s": cfg.max_total_ttl,
        "admin_group": cfg.policy.admin_group,
        "user_limits": sorted(cfg.policy.users),
        "group_limits": sorted(cfg.policy.groups),
    }


def _pool(path: str | Path) -> dict[str, Any]:
    from calque.aws.naming import pool_queue_name
    from calque.pool.process import shutdown_bound_s
    from calque.pool.spec import load_spec

    spec = load_spec(path)
    return {
        "model": spec.model,
        "queue_name": spec.queue_name or pool_queue_name(spec.model),
        "workload": spec.workload,
        "workers": spec.workers,
        "cuda_visible_devices": spec.cuda_visible_devices,
        "metrics_port": spec.metrics_port,
        "shutdown_bound_s": shutdown_bound_s(spec),
    }
