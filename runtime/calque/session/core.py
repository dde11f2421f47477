"""What the CLI verbs call: one function per verb over ``SessionClient``, returning models."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from calque.durations import format_duration, parse_duration
from calque.errors import RefusedError, UsageError
from calque.models.session import Session, SliceState, UsageReport
from calque.session.client import NoFreeSliceError, SessionClient


def checkout(
    client: SessionClient,
    *,
    profile: str | None,
    mps: bool,
    gpu: int | None,
    ttl: str | None,
    consent: bool,
    wait: bool,
    wait_timeout: float | None = None,
    progress: Callable[[str], None] = lambda m: None,
) -> Session:
    if mps and profile:
        raise UsageError("give either --mps or --profile, not both")
    if mps and not consent:
        raise RefusedError(
            "an MPS slot shares one GPU's memory and faults with other users, with no isolation; "
            "pass --i-understand-shared-gpu-has-no-isolation to accept that"
        )
    if ttl is not None:
        parse_duration(ttl, what="--ttl")  # fail on a typo before talking to the daemon
    args: dict[str, Any] = {"mps": mps, "profile": profile, "gpu": gpu, "ttl": ttl, "consent": consent}
    started = time.monotonic()
    delay = 0.5
    told = False
    while True:
        try:
            return Session.model_validate(client.call("checkout", **args))
        except NoFreeSliceError as exc:
            if not wait:
                raise
            if wait_timeout is not None and time.monotonic() - started + delay > wait_timeout:
                raise NoFreeSliceError(f"{exc} (waited {wait_timeout:g} s)") from exc
            if not told:
                progress(f"waiting for a free slice: {exc}")
                told = True
            time.sleep(delay)
            delay = min(delay * 1.5, 5.0)


def checkin(client: SessionClient, session_id: str | None) -> Session:
    return Session.model_validate(client.call("checkin", id=session_id))


def extend(client: SessionClient, session_id: str | None, by: str) -> Session:
    parse_duration(by, what="--by")
    return Session.model_validate(client.call("extend", id=session_id, by=by))


def status(client: SessionClient) -> list[Session]:
    return [Session.model_validate(s) for s in client.call("status")]


def list_slices(client: SessionClient) -> list[SliceState]:
    return [SliceState.model_validate(s) for s in client.call("list")]


def release(client: SessionClient, session_id: str, force: bool, reason: str | None = None) -> Session:
    if not force:
        raise UsageError("release ends another user's session; pass --force")
    return Session.model_validate(client.call("release", id=session_id, force=True, reason=reason))


def report(client: SessionClient, since: str) -> UsageReport:
    parse_duration(since, what="--since")
    return UsageReport.model_validate(client.call("report", since=since))


def human_left(until: datetime, now: datetime | None = None) -> str:
    secs = int(max(0.0, (until - (now or datetime.now(timezone.utc))).total_seconds()))
    return format_duration(secs - secs % 60 if secs >= 3600 else secs)  # seconds only matter in the last hour


def stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
