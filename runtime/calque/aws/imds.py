"""The instance metadata service (IMDSv2), and the one place a client of it is built (its address,
``IMDS_ENDPOINT``, is ``calque.models.imds_address``: the specs default to it).

IMDSv2: ``PUT /latest/api/token`` (with ``X-aws-ec2-metadata-token-ttl-seconds``) returns a token;
every ``GET /latest/meta-data/...`` carries it as ``X-aws-ec2-metadata-token``. A pool worker reads its
instance type, id and lifecycle state and watches for spot notices (``pool/worker/``); an elastic
session host reads its own identity (``calque session fleet``). Offline (tests, sandbox) only a
loopback stand-in may be reached, as with every AWS endpoint (``calque.aws.clients``).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from calque.aws.clients import is_loopback_url, offline
from calque.models.imds_address import IMDS_ENDPOINT

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


def metadata_client(endpoint: str = IMDS_ENDPOINT) -> Imds | None:
    """The IMDSv2 client of ``endpoint`` (the instance's own by default), or None where it may not be
    reached (offline, not loopback)."""
    return Imds(endpoint) if imds_allowed(endpoint) else None
