"""The session daemon's configuration file: paths, MPS slots, time limits and per-user/group policy.

Every path is configurable (file, then ``CALQUE_SESSION_*`` environment, then flags) so that tests and
the sandbox run a real daemon in a temporary directory. The file carries a version and rejects
unknown keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import AliasChoices, ConfigDict, Field, field_validator, model_validator

from calque.configfile import load_service_config
from calque.gpu.mps_control import DEFAULT_LOG_ROOT, DEFAULT_PIPE_ROOT
from calque.gpu.selection import Backend
from calque.models.base import BindAddress, CalqueModel, Seconds, VersionedModel
from calque.models.mail import MailRelay
from calque.quantities import Mebibytes, Percent
from calque.session.paths import DEFAULT_CONFIG, DEFAULT_SOCKET

CONFIG_VERSION = 1


class Limits(CalqueModel):
    """Limits for a user or group; unset fields fall back to the defaults."""

    max_sessions: int | None = Field(
        None, ge=0, description="concurrent sessions: of the user; for a group, of all its members together"
    )
    max_ttl: Seconds | None = Field(None, gt=0, description="seconds one checkout (plus extensions) may last")


class Policy(CalqueModel):
    default: Limits = Field(default_factory=lambda: Limits(max_sessions=1, max_ttl=8 * 3600))
    users: dict[str, Limits] = Field(default_factory=dict)
    groups: dict[str, Limits] = Field(default_factory=dict)
    admin_group: str | None = Field("calque-admin", description="members may list holders and force-release")

    def limits_for(self, user: str, groups: Iterable[str], max_total_ttl: float) -> Limits:
        """One user's own limits: their ``users`` entry, else ``default``. ``max_ttl`` is per session, so
        a group's applies to each member (the largest of the user's groups); a group's ``max_sessions``
        is not a per-member limit but the group's total (``group_limits``)."""
        if user in self.users:
            own = self.users[user]
        else:
            ttls = [self.groups[g].max_ttl for g in sorted(groups) if g in self.groups]
            known = [t for t in ttls if t is not None]
            own = Limits(max_sessions=None, max_ttl=max(known) if known else None)
        max_sessions = own.max_sessions if own.max_sessions is not None else self.default.max_sessions
        max_ttl = own.max_ttl if own.max_ttl is not None else self.default.max_ttl
        if max_ttl is None or max_ttl > max_total_ttl:
            max_ttl = max_total_ttl
        return Limits(max_sessions=max_sessions, max_ttl=max_ttl)

    def group_limits(self, groups: Iterable[str]) -> dict[str, int]:
        """Session limits of the user's groups, each counted over all members together (Slurm's
        GrpTRES meaning), on top of the user's own limit."""
        return {g: lim for g in groups if g in self.groups and (lim := self.groups[g].max_sessions) is not None}


def _signal_name(v: str, what: str) -> str:
    import signal

    if not v.startswith("SIG") or not isinstance(getattr(signal, v, None), signal.Signals):
        raise ValueError(f"{what} {v!r} is not a signal name; use e.g. SIGUSR1 or SIGHUP")
    return v


class IdlePolicy(CalqueModel):
    """Idle reclaim: a session whose slice shows no activity for ``for`` is ended (reason ``idle``).

    Idle is measured, never guessed (``session/daemon/activity.py``): the utilisation is read first,
    and the slice is active when any reading says so: its engines at or above ``below``, device memory
    in use on it (at or above ``memory_from``, by anyone's processes), its holder's own clients' use
    (MPS), or a reading the driver did not give (unknown is active). ``extend`` does not reset the
    clock; activity does. Before the end the holder is told (``warn``) and, with
    ``checkpoint_signal``, the session's processes get that signal ``checkpoint_before`` the SIGTERM.
    """

    model_config = ConfigDict(populate_by_name=True)

    below: Percent = Field(5.0, description="activity under this is idle: 5% or 0.05 (SM or graphics, the larger)")
    for_: Seconds = Field(1800.0, gt=0, alias="for", description="idle this long and the session is ended")
    warn: Seconds = Field(600.0, ge=0, description="the holder is told this long before (0: no notice)")
    memory_from: Mebibytes | None = Field(
        64,
        ge=0,
        description="device memory in use on the slice at or above this (MiB, or 4GiB) counts as activity: a "
        "process's CUDA context or a loaded model keeps the slice; null: memory never counts",
    )
    checkpoint_signal: str | None = Field(
        None,
        description="sent to the session's processes checkpoint_before the SIGTERM of an idle end (e.g. SIGUSR1; "
        "a process with no handler for it dies of it); off when unset",
    )
    checkpoint_before: Seconds = Field(60.0, gt=0, description="how long before the SIGTERM the checkpoint signal goes")
    exempt_groups: list[str] = Field(default_factory=list, description="members' sessions are never reclaimed")

    @field_validator("checkpoint_signal")
    @classmethod
    def _checkpoint_signal(cls, v: str | None) -> str | None:
        return None if v is None else _signal_name(v, "idle.checkpoint_signal")

    @model_validator(mode="after")
    def _warn_within(self) -> IdlePolicy:
        if self.warn >= self.for_:
            raise ValueError(f"idle.warn ({self.warn:g} s) must be shorter than idle.for ({self.for_:g} s)")
        if self.checkpoint_signal is not None and self.checkpoint_before >= self.for_:
            raise ValueError(
                f"idle.checkpoint_before ({self.checkpoint_before:g} s) must be shorter than idle.for ({self.for_:g} s)"
            )
        return self


class MpsGpu(CalqueModel):
    """MPS client slots on one GPU (the GPU runs an MPS control daemon started by the GPU layer)."""

    gpu: int = Field(ge=0)
    slots: int = Field(ge=1, le=48)
    active_thread_percentage: int = Field(ge=1, le=100)
    pinned_mem_limit_mib: int = Field(ge=1)
    pipe_directory: str | None = Field(None, description="defaults to mps_pipe_root/gpu<N>")
    log_directory: str | None = Field(None, description="defaults to mps_log_root/gpu<N>")


class TcpListen(CalqueModel):
    """Where the daemon listens for munge-authenticated requests from other hosts (the broker's, or a
    user's own ``--anywhere`` client); the unix socket stays the local path."""

    address: BindAddress
    port: int = Field(7461, ge=1, le=65535)


class SessionConfig(VersionedModel):
    version_label: ClassVar[str] = "session config"
    upgrade_hint: ClassVar[str] = "upgrade calque on this host, or write the file's older version"
    version: int = CONFIG_VERSION
    socket: Path = DEFAULT_SOCKET
    db: Path = Path("/var/lib/calque/sessions.db")
    audit_log: Path = Path("/var/log/calque/session-audit.jsonl")
    host_root: Path | None = Field(
        None, description="where /proc/driver/nvidia and /dev/nvidia-caps live (default: /, or the simulator's root)"
    )
    gpu_backend: Backend = Field(
        "host", description="host: the GPU layer's host configuration (/etc/calque/host.yaml); none: MPS slots only"
    )
    sim_state: Path | None = Field(
        None,
        validation_alias=AliasChoices("sim_state", "gpu_state"),  # gpu_state: its name before calque 0.2
        description="simulator state file (gpu_backend: sim)",
    )
    host_config: Path | None = Field(None, description="host configuration for gpu_backend: host (default as the CLI)")
    mps: list[MpsGpu] = Field(default_factory=list)
    mps_pipe_root: Path = Field(DEFAULT_PIPE_ROOT, description="as the GPU layer's MPS daemons use it")
    mps_log_root: Path = DEFAULT_LOG_ROOT
    mps_user_model: Literal["serialised-per-user", "multi-user"] = Field(
        "serialised-per-user",
        description="serialised-per-user: all slots of one MPS daemon go to one Unix user at a time "
        "(see `calque gpu mps status`); multi-user: slots of one daemon may go to different users",
    )
    default_ttl: Seconds = 3600
    max_total_ttl: Seconds = 12 * 3600
    notice_before: Seconds = 300
    final_notice_before: Seconds | None = Field(
        60,
        gt=0,
        description="a last line on the holder's terminals this long before the end (off if unset or >= notice_before)",
    )
    notice_signal: str = "SIGUSR1"
    kill_grace: Seconds = 10
    reassert_every: Seconds = Field(
        5.0, gt=0, description="seconds between re-checks of capability node owners and modes (holders and free slices)"
    )
    idle_expiry: Seconds | None = Field(
        None,
        description="older spelling of idle: {below: 0%, for: <this>, warn: 0} (no process, memory in use or "
        "activity on the slice this long)",
    )
    idle: IdlePolicy | None = Field(None, description="idle reclaim by measured utilisation (off when unset)")
    mail: MailRelay | None = Field(
        None,
        description="mail the idle reclaim's warning to the holder through this SMTP relay (as the broker's mail: "
        "relay, port, sender, domain, users); terminals only when unset",
    )
    policy: Policy = Field(default_factory=Policy)
    spot: bool = Field(
        False, description="this host is a spot instance (the session_service role: calque_session_service_spot)"
    )
    request_timeout: Seconds = Field(5.0, gt=0, description="seconds a client has to send its request")
    max_request_bytes: int = Field(64 * 1024, ge=256)
    processes: int = Field(
        2,
        ge=1,
        le=64,
        description="worker processes serving requests (timers stay in the main process); "
        "more than 1 uses more than one CPU for requests",
    )
    max_connections: int = Field(
        64, ge=1, le=1024, description="requests served at once per worker process (threads); the rest queue per uid"
    )
    max_connections_per_uid: int = Field(
        128, ge=1, le=4096, description="connections one uid may hold open per worker process; more are refused at once"
    )
    cgroups: Literal["auto", "systemd", "direct", "off"] = Field(
        "auto",
        description="where a session's processes live: a transient systemd scope (systemd is PID 1), a cgroup v2 "
        "directory under cgroup_parent (direct), auto (whichever this host has), or off",
    )
    cgroup_parent: Path | None = Field(
        None, description="direct mode: the cgroup v2 directory session cgroups go under (default <cgroup2>/calque)"
    )
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="serve Prometheus metrics on <port> (off if unset)"
    )
    metrics_addr: BindAddress = Field(
        "127.0.0.1", description="the address the metrics port binds (loopback unless exposed)"
    )
    metrics_textfile: Path | None = Field(None, description="also write metrics to this *.prom file for node_exporter")
    listen_tcp: TcpListen | None = Field(
        None, description="serve munge-authenticated requests from other hosts (off if unset)"
    )
    host_name: str | None = Field(
        None, min_length=1, max_length=253, description="this host's name in institution.yaml (default: its hostname)"
    )
    institution: Path = Field(
        Path("/etc/calque/institution.yaml"), description="the institution's hosts, broker and labs"
    )
    munge_socket: Path | None = Field(None, description="munged's socket (default: munge's own)")
    max_tcp_connections: int = Field(
        256, ge=1, le=4096, description="TCP connections one client address may hold open per worker process"
    )
    broker_nudge: str | None = Field(
        None,
        pattern=r"^[0-9A-Fa-f.:\[\]]+:[0-9]{1,5}$",
        description="ADDR:PORT (UDP) of the institution's broker, told whenever a slice here is taken or freed",
    )
    scale_in_guard: Path | None = Field(
        None,
        description="an elastic host: the fleet helper's guard directory; a checkout waits for scale-in protection",
    )
    scale_in_wait: Seconds = Field(
        30.0, gt=0, description="how long a checkout waits for the fleet helper to protect the instance"
    )
    degraded_after: Seconds = Field(
        30.0,
        gt=0,
        description="with a broker in institution.yaml: checkouts go through its queue while it asked this host "
        "within this long; after that the host serves them directly (degraded mode, audited)",
    )
    notebook_command: list[str] = Field(
        default_factory=lambda: ["jupyterhub-singleuser", "--ip={ip}", "--port={port}"],
        min_length=1,
        description="the one command the `notebook` request starts as the session's user in its cgroup ({ip} and "
        "{port} filled in by the daemon); no request can name another",
    )
    notebook_ip: BindAddress = Field(
        "127.0.0.1",
        description="the address the single-user server binds: this host's address on the institution's network "
        "where a hub on another host must reach it",
    )
    notebook_env: dict[str, str] = Field(
        default_factory=dict,
        description="more variables for the single-user server (PATH of the notebook environment, say); the "
        "session's own (CUDA_VISIBLE_DEVICES, CALQUE_SESSION_*) always win",
    )
    direct_users: list[str] = Field(
        default_factory=list,
        description="local service accounts that may check out past the institution's queue with --direct, as "
        "admins may (the session_service role's locked verify user): each such checkout is audited as an override",
    )

    @model_validator(mode="after")
    def _one_idle_rule(self) -> SessionConfig:
        if self.idle_expiry is not None and self.idle is not None:
            raise ValueError("give idle (below, for, warn) or the older idle_expiry, not both")
        return self

    @property
    def idle_policy(self) -> IdlePolicy | None:
        """The idle rule in force: ``idle``, or ``idle_expiry`` read as no process for that long."""
        if self.idle is None and self.idle_expiry is not None:
            return IdlePolicy(below=0.0, for_=self.idle_expiry, warn=0.0)
        return self.idle

    @field_validator("notice_signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        return _signal_name(v, "notice_signal")


def load_config(path: Path | None) -> SessionConfig:
    """Read the YAML config; a missing default file means all defaults, a missing explicit one is an error."""
    return load_service_config(SessionConfig, path, DEFAULT_CONFIG, "session config")
