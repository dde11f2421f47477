"""Watch for an EC2 spot interruption notice over IMDSv2 and ask the worker to stop.

IMDSv2: ``PUT /latest/api/token`` (with ``X-aws-ec2-metadata-token-ttl-seconds``) returns a token;
``GET /latest/meta-data/spot/instance-action`` with ``X-aws-ec2-metadata-token`` returns 404 until
AWS schedules the interruption (about two minutes ahead), then 200 with ``{"action", "time"}``.
A GET without a token is refused (401), as on instances that require IMDSv2.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from calque.aws.clients import is_loopback_url, offline

log = logging.getLogger("calque.pool.spot")
TOKEN_TTL_S = 21600
_TIMEOUT_S = 1.0


class Imds:
    """A tiny IMDSv2 client (token cached until shortly before it expires)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._token: str | None = None
        self._token_expires = 0.0

    def _refresh(self) -> str:
        if self._token is None or time.monotonic() > self._token_expires:
            req = urllib.request.Request(
                f"{self.endpoint}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as resp:
                self._token = resp.read().decode().strip()
            self._token_expires = time.monotonic() + TOKEN_TTL_S - 60
        return self._token

    def get(self, path: str) -> str | None:
        """The metadata at ``path``, or None on 404."""
        for attempt in range(2):
            req = urllib.request.Request(
                f"{self.endpoint}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": self._refresh()}
            )
            try:
                with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as resp:
                    return str(resp.read().decode())
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 0:
                    self._token = None  # expired token: fetch a new one once
                    continue
                raise
        return None


def imds_allowed(endpoint: str) -> bool:
    """Offline (tests, sandbox) only a loopback fake IMDS may be reached."""
    return not offline() or is_loopback_url(endpoint)


class SpotWatcher:
    """Polls ``spot/instance-action`` every ``interval_s``; calls ``on_notice(action)`` once."""

    def __init__(self, endpoint: str, interval_s: float, on_notice: Callable[[str], None]) -> None:
        self.imds = Imds(endpoint)
        self.interval_s = interval_s
        self.on_notice = on_notice
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="calque-spot", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def poll_once(self) -> str | None:
        body = self.imds.get("spot/instance-action")
        if body is None:
            return None
        try:
            action = str(json.loads(body).get("action", "terminate"))
        except (ValueError, AttributeError):
            action = "terminate"
        return action

    def _run(self) -> None:
        warned = False
        while not self._stop.is_set():
            try:
                action = self.poll_once()
                if action is not None:
                    log.warning("spot interruption notice (%s): stopping", action)
                    self.on_notice(action)
                    return
            except (OSError, urllib.error.URLError) as exc:
                if not warned:
                    log.warning("cannot reach IMDS at %s (%s); will keep trying", self.imds.endpoint, exc)
                    warned = True
            self._stop.wait(self.interval_s)
