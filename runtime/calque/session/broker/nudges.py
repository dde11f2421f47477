"""Which UDP nudges the broker believes. A host daemon nudges when a slice there is taken or freed: one
datagram, a munge credential its own process made (so of its service user's uid) whose payload names
the host (``NUDGE_PREFIX`` + name). A nudge only makes the broker list that host over the
authenticated transport, so it is a cost, not a claim; this gate keeps anyone else from spending it:

- at most ``DECODES_PER_SECOND`` datagrams a second are decoded at all (a flood costs munged nothing more);
- munged refuses a bad, expired or replayed credential (a datagram is believed once);
- the payload must name a host the broker has now (``institution.yaml``'s, or an elastic host as it
  registers), and the credential's uid must be that host's service user's;
- at most ``per_host_per_second`` nudges a second are taken per host (a burst of one more).

Anything else is dropped and counted; the counts are logged at most once per ``LOG_EVERY_S``.
"""

from __future__ import annotations

import collections
import logging
import pwd
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from calque.models.institution import NUDGE_PREFIX
from calque.session import munge

log = logging.getLogger("calque.broker")

NUDGE_MAX_BYTES = 2048  # a credential for a host name is a few hundred bytes
DECODES_PER_SECOND = 200.0
LOG_EVERY_S = 60.0

ServiceUsers = Callable[[], Mapping[str, str]]  # host name -> the Unix user its daemon runs as, now


class Bucket:
    """A token bucket: ``rate`` a second, ``burst`` at once."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class NudgeGate:
    def __init__(self, service_users: ServiceUsers, *, munge_socket: Path | None, per_host_per_second: float) -> None:
        self.service_users = service_users
        self.munge_socket = munge_socket
        self.per_host_per_second = per_host_per_second
        self._decodes = Bucket(DECODES_PER_SECOND, DECODES_PER_SECOND)
        self._hosts: dict[str, Bucket] = {}
        self.taken = 0
        self.dropped: collections.Counter[str] = collections.Counter()
        self._logged_at = time.monotonic()
        self._lock = threading.Lock()

    def check(self, datagram: bytes, sender: str) -> str | None:
        """The host a believed nudge names; None for one dropped (the reason counted)."""
        with self._lock:
            host, why = self._check(datagram)
            if host is not None:
                self.taken += 1
            else:
                self.dropped[why] += 1
                self._report(sender, why)
            return host

    def _check(self, datagram: bytes) -> tuple[str | None, str]:
        if not self._decodes.take():
            return None, "over the decode rate"
        try:
            cred = munge.decode(datagram.decode("ascii", "replace").strip(), socket=self.munge_socket)
        except munge.MungeError as exc:
            return None, f"credential {exc.reason}"
        except munge.MungeUnavailable:
            return None, "munge unavailable"
        if not cred.payload.startswith(NUDGE_PREFIX):
            return None, "not a nudge's credential"
        host = cred.payload[len(NUDGE_PREFIX) :].decode("utf-8", "replace")
        user = self.service_users().get(host)
        if user is None:
            return None, "names no host of the institution"
        try:
            uid = pwd.getpwnam(user).pw_uid
        except KeyError:
            return None, f"service user {user} has no uid here"
        if cred.uid != uid:
            return None, f"not made by {host}'s service user"
        bucket = self._hosts.setdefault(host, Bucket(self.per_host_per_second, max(1.0, self.per_host_per_second)))
        if not bucket.take():
            return None, f"over {host}'s rate"
        return host, ""

    def _report(self, sender: str, why: str) -> None:
        now = time.monotonic()
        if sum(self.dropped.values()) == 1 or now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            counts = ", ".join(f"{n} {reason}" for reason, n in self.dropped.most_common())
            log.warning("dropped a nudge from %s (%s); dropped so far: %s", sender, why, counts)
