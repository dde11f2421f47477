"""The broker's configuration file (``/etc/calque/broker.yaml``): where it keeps its queue, where it
listens, the queue's rules, and the hosts it reaches on its own machine. The institution (its other
hosts, the labs and their shares) is ``institution.yaml`` (``calque.models.institution``).

Beside ``session_config.py``, outside both rooms: ``calque session broker`` reads and checks it before it
execs the broker, as ``calque session serve`` does the daemon's.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from calque.configfile import load_service_config
from calque.models.base import BindAddress, CalqueModel, Seconds, VersionedModel
from calque.models.fleet import DemandSettings
from calque.models.mail import MailSettings

BROKER_CONFIG_VERSION = 1
DEFAULT_BROKER_CONFIG = Path("/etc/calque/broker.yaml")
DEFAULT_BROKER_SOCKET = Path("/run/calque/broker.sock")
DEFAULT_BROKER_PORT = 7460  # as institution.yaml's broker.port defaults


class QueueRules(CalqueModel):
    """How the waiting queue orders and bounds requests."""

    fair_share_window: Seconds = Field(7 * 86400, gt=0, description="the last N seconds of usage labs are compared by")
    usage_every: Seconds = Field(
        30.0, gt=0, description="seconds between readings of every host's sessions (all usage, however granted)"
    )
    aging: Seconds = Field(
        1800, gt=0, description="a request waiting this long goes ahead of every later one, whatever its lab"
    )
    max_queued_per_user: int = Field(4, ge=1, le=1000, description="live queued requests one user may hold")
    claim_window: Seconds = Field(
        60,
        gt=0,
        description="how long a grant is held for a client whose connection dropped, then passed on; and how long "
        "a queued request waits for its client to come back (same request id) before it is dropped",
    )
    granting_for: Seconds = Field(
        600,
        gt=0,
        description="how long a grant on a host that does not answer is retried (same request id) before the "
        "request expires; what the host made meanwhile is checked in when it answers again",
    )
    assumed_ttl: Seconds = Field(3600, gt=0, description="a request without --ttl counts this long in fair share")
    default_share: float = Field(1.0, gt=0, description="the share of users in no lab's groups (lab 'default')")


class PoolLedgerSettings(CalqueModel):
    """Where the broker reads the labs' pools (their groups, their instances' usage records) and holds them."""

    region: str = Field(description="the AWS region of the pools' Auto Scaling groups")
    endpoint_url: str | None = Field(None, description="an AWS endpoint (moto in tests and the sandbox)")


class BrokerConfig(VersionedModel):
    version_label: ClassVar[str] = "broker config"
    upgrade_hint: ClassVar[str] = "upgrade calque on the front-door host, or write the file's older version"
    version: int = BROKER_CONFIG_VERSION
    socket: Path = DEFAULT_BROKER_SOCKET
    db: Path = Path("/var/lib/calque/broker.db")
    tcp_addr: BindAddress | None = Field(
        None,
        description="where researchers on other hosts reach the broker (TCP, munge) and host daemons nudge it (UDP, "
        "the same port); off if unset",
    )
    tcp_port: int = Field(DEFAULT_BROKER_PORT, ge=1, le=65535)
    admin_group: str | None = Field("calque-admin", description="members see every request and may cancel any")
    queue: QueueRules = Field(default_factory=QueueRules)
    institution: Path = Field(
        Path("/etc/calque/institution.yaml"),
        description="the institution's hosts (reached over TCP with munge) and labs with their shares",
    )
    munge_socket: Path | None = Field(None, description="munged's socket (default: munge's own)")
    audit_log: Path = Field(
        Path("/var/log/calque/broker-audit.jsonl"), description="one line per refused request from another host"
    )
    local_hosts: dict[str, Path] = Field(
        default_factory=dict,
        description="session hosts whose daemon's unix socket is on this machine: name -> socket (the local path)",
    )
    mail: MailSettings | None = Field(
        None, description="mail notices (a grant to a waiter, an end near, a lab's budget) through an SMTP relay"
    )
    fleet: DemandSettings | None = Field(
        None, description="elastic session-host classes: the demand published for them, their hosts' registrations"
    )
    pools: PoolLedgerSettings | None = Field(
        None,
        description="count the labs' pools in their months (from their usage records) and hold an over-budget "
        "lab's groups at its running claims; off if unset (the months are sessions only)",
    )
    poll_every: Seconds = Field(5.0, gt=0, description="seconds between polls of each host (pushes come between)")
    ledger_every: Seconds = Field(
        300.0, gt=0, description="seconds between rounds of each lab's month against its budget (and its mail)"
    )
    host_timeout: Seconds = Field(5.0, gt=0, description="seconds one call to a host daemon may take")
    host_answer_within: Seconds = Field(
        1.0,
        gt=0,
        description="a host that has not answered a call within this is marked not answering (no grant goes there) "
        "while the call goes on in the background, up to host_timeout",
    )
    request_timeout: Seconds = Field(
        5.0, gt=0, description="seconds a client has from connecting to send its whole request"
    )
    max_request_bytes: int = Field(64 * 1024, ge=256)
    max_connections: int = Field(1024, ge=1, le=65536, description="connections held at once (waiters hold one)")
    max_connections_per_uid: int = Field(
        64, ge=1, le=4096, description="connections one authenticated user may hold (counted once a request is read)"
    )
    max_unread: int = Field(
        256, ge=2, le=65536, description="connections whose request is not read yet (nobody known), all together"
    )
    max_unread_per_source: int = Field(
        32,
        ge=1,
        le=65536,
        description="of those, from one address (TCP) or uid (unix socket): one more closes that source's oldest",
    )
    nudges_per_host_per_second: float = Field(
        20.0, gt=0, le=10000, description="signed nudges taken from one host per second (the rest are dropped)"
    )
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="serve Prometheus metrics (the queue by lab, its waits) on <port>"
    )
    metrics_addr: BindAddress = Field(
        "127.0.0.1", description="the address the metrics port binds (loopback unless exposed)"
    )


def load_broker_config(path: Path | None) -> BrokerConfig:
    """Read the YAML config; a missing default file means all defaults, a missing explicit one is an error."""
    return load_service_config(BrokerConfig, path, DEFAULT_BROKER_CONFIG, "broker config")
