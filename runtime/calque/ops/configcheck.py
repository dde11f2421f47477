"""Checking a configuration file exactly as the service that reads it will, before it is installed.

The calque.gpu roles render ``/etc/calque/host.yaml``, ``/etc/calque/session.yaml`` and
``/etc/calque/pool.yaml`` and run ``calque config check KIND FILE`` on the host as the template's
``validate:`` step, so a bad inventory value fails the play with the loader's own message and the
installed file is never replaced by one the service would refuse. The summary also carries what a
role needs from the file (a pool worker's shutdown bound for systemd's ``TimeoutStopSec``).

A session configuration is also checked against this host, as the daemon builds its slices at start:
its GPU backend opened, every MPS slot on a GPU the host has and that is not in MIG mode (an MPS slot
naming GPU 1 on a one-GPU host is refused here, not by a unit that crash-loops). ``against_host=False``
(``--file-only``) checks the file alone, on a machine that is not its host. ``-`` reads standard
input (the roles check what they are about to write, in check mode too).

A session or broker configuration is checked with the institution file it will run with: the one it
names (``institution:``), or ``institution`` (``--institution``: the file a role is about to write,
staged, so ``/etc/calque/institution.yaml`` is replaced only once the pair passes). That file is loaded
as the service loads it; a session daemon that listens on TCP must be one of its hosts, on the port it
lists there (the broker and the other hosts reach it by that name and port, and a request for any other
name is refused); a broker listening on TCP must be on the broker port it gives. ``--file-only``
without ``institution`` skips this (the names are this machine's).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from calque.models.base import CalqueModel

ConfigKind = Literal["host", "session", "pool", "broker"]
KINDS: tuple[ConfigKind, ...] = ("host", "session", "pool", "broker")


class ConfigCheck(CalqueModel):
    """A file that loaded cleanly, and the facts about it a person or a role wants next."""

    kind: ConfigKind
    path: str
    summary: dict[str, Any] = Field(default_factory=dict)


def check_config(
    kind: ConfigKind, path: str | Path, *, against_host: bool = True, institution: str | Path | None = None
) -> ConfigCheck:
    """Load ``path`` as ``kind`` (``-``: standard input); a ``UsageError`` says what is wrong. ``institution``:
    the institution file a session configuration is checked with (default: the one it names)."""
    from calque.errors import UsageError

    if institution is not None and kind not in ("session", "broker"):
        raise UsageError(f"--institution checks a session or broker configuration with it, not a {kind} configuration")
    inst = Path(institution) if institution is not None else None
    if kind == "pool":  # the pool spec's loader reads standard input itself
        return ConfigCheck(kind=kind, path=str(path), summary=_pool(path))
    if str(path) != "-":
        return ConfigCheck(kind=kind, path=str(path), summary=_load(kind, Path(path), against_host, inst))

    with tempfile.TemporaryDirectory(prefix="calque-config-check-") as d:
        staged = Path(d) / f"{kind}.yaml"
        staged.write_text(sys.stdin.read(), encoding="utf-8")
        try:
            return ConfigCheck(kind=kind, path="-", summary=_load(kind, staged, against_host, inst))
        except UsageError as exc:  # the staged copy's name means nothing to whoever piped it in
            raise UsageError(str(exc).replace(str(staged), "(standard input)")) from exc


def _load(kind: ConfigKind, path: Path, against_host: bool, institution: Path | None) -> dict[str, Any]:
    if kind == "broker":
        return _broker(path, against_host, institution)
    return _host(path) if kind == "host" else _session(path, against_host, institution)


def _broker(path: Path, against_host: bool, institution: Path | None) -> dict[str, Any]:
    from calque.session.broker.broker_config import load_broker_config

    cfg = load_broker_config(path)
    facts = {
        "socket": str(cfg.socket),
        "db": str(cfg.db),
        "hosts": sorted(cfg.local_hosts),
        "institution": str(cfg.institution),
        "tcp": f"{cfg.tcp_addr}:{cfg.tcp_port}" if cfg.tcp_addr else None,
        "mail": cfg.mail.relay if cfg.mail else None,
    }
    if against_host or institution is not None:
        facts.update(_broker_with_institution(cfg, institution or cfg.institution))
    return facts


def _broker_with_institution(cfg: Any, path: Path) -> dict[str, Any]:
    """The institution file ``path`` loaded as the broker loads it at start, and the broker's port in it."""
    from calque.errors import UsageError
    from calque.session.institution import load_institution

    inst = load_institution(path)
    if cfg.tcp_addr is not None and inst.broker is not None and inst.broker.port != cfg.tcp_port:
        raise UsageError(
            f"the broker listens on port {cfg.tcp_port} (tcp_port), but the institution file {path} gives its port "
            f"as {inst.broker.port}, where researchers' clients and the hosts' nudges go; make them agree"
        )
    return _institution_facts(path, inst)


def _institution_facts(path: Path, inst: Any) -> dict[str, Any]:
    """What a check prints of the institution file it read: where, how many hosts, which labs."""
    return {"institution": str(path), "institution_hosts": len(inst.hosts), "labs": [lab.name for lab in inst.labs]}


def _host(path: str | Path) -> dict[str, Any]:
    from calque.gpu.hostconfig import load_gpu_config

    cfg = load_gpu_config(path)
    sim = cfg.sim
    return {
        "gpu_backend": cfg.backend,
        "sim_state": str(sim.state) if sim is not None else None,
        "sim_shape": (sim.instance_type or sim.cards) if sim is not None else None,
    }


def _session(path: str | Path, against_host: bool, institution: Path | None) -> dict[str, Any]:
    from calque.session.session_config import load_config

    cfg = load_config(Path(path))
    here = _session_on_host(cfg) if against_host else {}
    if against_host or institution is not None:
        here.update(_session_with_institution(cfg, institution or cfg.institution))
    return {
        "gpu_backend": cfg.gpu_backend,
        "socket": str(cfg.socket),
        "mps_slots": sum(g.slots for g in cfg.mps),
        "default_ttl_s": cfg.default_ttl,
        "max_total_ttl_s": cfg.max_total_ttl,
        "admin_group": cfg.policy.admin_group,
        "user_limits": sorted(cfg.policy.users),
        "group_limits": sorted(cfg.policy.groups),
        **here,
    }


def _session_with_institution(cfg: Any, path: Path) -> dict[str, Any]:
    """The institution file ``path`` loaded as the daemon loads it, and this daemon's place in it."""
    import socket

    from calque.errors import UsageError
    from calque.session.institution import load_institution

    inst = load_institution(path)  # a missing file is an institution of one host, as for the daemon
    if cfg.listen_tcp is not None:
        name = cfg.host_name or socket.gethostname()
        entry = inst.host(name)
        known = ", ".join(h.name for h in inst.hosts) or (
            "none: the file does not exist" if not path.exists() else "none"
        )
        if entry is None:
            raise UsageError(
                f"listen_tcp serves requests from other hosts, but the institution file {path} lists no host named "
                f"{name!r} (its hosts: {known}): the broker and the other hosts address this one by its name there, "
                "and the daemon refuses a request for any other name; add the host there, or set host_name"
            )
        if entry.port != cfg.listen_tcp.port:
            raise UsageError(
                f"listen_tcp listens on port {cfg.listen_tcp.port}, but the institution file {path} lists host "
                f"{name!r} on port {entry.port}, where the broker and the other hosts will connect; make them agree"
            )
    return {**_institution_facts(path, inst), "broker": inst.broker.name if inst.broker is not None else None}


def _session_on_host(cfg: Any) -> dict[str, Any]:
    """The slices the daemon would build from ``cfg`` on this host (its ``inventory`` at start)."""
    from calque.errors import UsageError
    from calque.session.slices import inventory, load_reader

    reader = load_reader(cfg)
    try:
        slices = inventory(cfg, reader)
    except UsageError as exc:
        raise UsageError(f"on this host, {exc} (the session daemon would refuse to start)") from exc
    per_gpu: dict[int, int] = {}
    for sl in slices:
        if sl.kind == "mps":
            per_gpu[sl.gpu_index] = per_gpu.get(sl.gpu_index, 0) + 1
    return {
        "host_gpus": len(reader.gpus()) if reader is not None else None,
        "mig_slices": sum(1 for sl in slices if sl.kind == "mig"),
        "mps_slots_per_gpu": {str(g): n for g, n in sorted(per_gpu.items())},
    }


def _pool(path: str | Path) -> dict[str, Any]:
    from calque.aws.naming import pool_queue_name
    from calque.pool.spec import load_spec
    from calque.pool.worker.worker_process import shutdown_bound_s

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
