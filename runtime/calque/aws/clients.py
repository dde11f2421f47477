"""The one factory for AWS clients (botocore's, what boto3 hands out too).

It honours the standard ``AWS_ENDPOINT_URL`` (and per-service ``AWS_ENDPOINT_URL_<SERVICE>``) or an
explicit ``endpoint_url``, a region and a profile, and uses botocore's standard retry mode. With
``CALQUE_OFFLINE=1`` (set by the tests and the sandbox) it refuses any endpoint that is not
loopback, so nothing offline can ever reach a real cloud.
"""

from __future__ import annotations

import contextlib
import gc
import ipaddress
import os
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from botocore.config import Config
from botocore.session import Session

from calque.errors import RefusedError, UsageError

OFFLINE_ENV = "CALQUE_OFFLINE"


def offline() -> bool:
    return os.environ.get(OFFLINE_ENV, "") not in ("", "0", "false", "no")


def is_loopback_url(url: str) -> bool:
    """True when ``url`` names 127.0.0.0/8, ::1 or localhost."""
    host = urlparse(url).hostname
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_endpoint(service: str, endpoint_url: str | None = None) -> str | None:
    """The endpoint boto3 will use for ``service``: explicit first, then the standard variables."""
    if endpoint_url:
        return endpoint_url
    specific = os.environ.get(f"AWS_ENDPOINT_URL_{service.upper().replace('-', '_')}")
    return specific or os.environ.get("AWS_ENDPOINT_URL") or None


def check_offline_endpoint(service: str, endpoint: str | None) -> None:
    """Refuse a non-loopback (or default, i.e. real AWS) endpoint while offline."""
    if not offline():
        return
    if endpoint is None:
        raise RefusedError(
            f"{OFFLINE_ENV}=1 but no endpoint is set for {service}: this would reach real AWS. "
            "Set AWS_ENDPOINT_URL to a loopback moto server (e.g. http://127.0.0.1:5000)."
        )
    if not is_loopback_url(endpoint):
        raise RefusedError(
            f"{OFFLINE_ENV}=1 refuses the non-loopback endpoint {endpoint!r} for {service}: "
            "offline runs may only reach 127.0.0.0/8 or localhost."
        )


def retry_config(max_attempts: int = 5, **extra: Any) -> Config:
    """botocore's standard retry mode: retries throttling and transient errors with jittered backoff."""
    return Config(retries={"max_attempts": max_attempts, "mode": "standard"}, **extra)


_LOADER: Any = None  # the process's one botocore data loader: it caches every service model it has read


def _session(profile: str | None) -> Session:
    """A fresh botocore session (credentials and region read now) sharing the process's data loader, so a
    second client does not parse the endpoint and service JSON again (``calque pool status`` makes three)."""
    global _LOADER
    session = Session(profile=profile) if profile else Session()
    if _LOADER is None:
        _LOADER = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _LOADER)
    return session


# Clients are made one at a time: making one is CPU under the GIL either way, and two made at once
# would each parse the endpoint and service data before the shared loader had cached it.
_making = threading.Lock()
_frozen = False


def _after_fork() -> None:
    global _making
    _making = threading.Lock()  # a forked child never inherits a lock another thread of its parent held


os.register_at_fork(after_in_child=_after_fork)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic collection while botocore builds a client (called with ``_making`` held).

    A client is some hundred thousand objects that live as long as the process (the endpoint data, the
    service model, the handlers): while they are made, every full collection walks all of them again,
    for nothing (a third of ``calque pool status``'s CPU here). The first client's are then moved out
    of the collector's sight for good (``gc.freeze``), once per process, so that later collections do
    not walk them either; whatever garbage exists at that one moment is never collected, a one-time cost.
    """
    global _frozen
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if not _frozen:
            gc.freeze()
            _frozen = True
        if enabled:
            gc.enable()


def client(
    service: str,
    *,
    region: str | None = None,
    endpoint_url: str | None = None,
    profile: str | None = None,
    config: Config | None = None,
    max_pool_connections: int | None = None,
    signature_version: str | None = None,
) -> Any:
    """A boto3 client for ``service``, refused while offline unless its endpoint is loopback.

    ``max_pool_connections`` and ``signature_version`` are botocore's settings of those names, so that
    no caller outside ``calque.aws`` builds a botocore ``Config``; ``config`` (``retry_config(...)``) is
    for ``calque.aws`` itself and the tests."""
    endpoint = resolve_endpoint(service, endpoint_url)
    check_offline_endpoint(service, endpoint)
    # botocore's own session, not boto3's: boto3 adds only resources and S3's transfer methods (neither
    # used here) and its import pulls in s3transfer, a third of `calque pool status`'s start-up
    extra: dict[str, Any] = {"max_pool_connections": max_pool_connections, "signature_version": signature_version}
    cfg = retry_config(**{k: v for k, v in extra.items() if v is not None})
    cfg = cfg if config is None else cfg.merge(config)
    with _making:
        try:
            session = _session(profile)
            region = region or session.get_config_variable("region") or "us-east-1"
        except Exception as exc:  # botocore.exceptions.ProfileNotFound and friends
            raise UsageError(f"cannot use AWS profile {profile!r}: {exc}") from exc
        factory: Any = session.create_client  # typed per service by the stubs; callers get Any either way
        with _collector_paused():
            made = factory(service, region_name=region, endpoint_url=endpoint, config=cfg)
    from calque.aws.aws_errors import name_the_call

    made.meta.events.register("after-call-error", name_the_call)  # errors name their call (calque.aws.aws_errors)
    return made


class LazyClient:
    """A client made at its first use, once, whichever thread uses it first: a command that reads
    several services at once makes each service's client on the thread that first needs it, while
    another thread waits on AWS (``calque pool status``), and a read it does not reach costs nothing."""

    def __init__(self, service: str, **options: Any) -> None:
        self.service = service
        self._options = options
        self._made: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        if self._made is None:
            with self._lock:
                if self._made is None:
                    self._made = client(self.service, **self._options)
        return self._made

    def __getattr__(self, name: str) -> Any:  # only names LazyClient lacks: the client's methods and meta
        return getattr(self.get(), name)
