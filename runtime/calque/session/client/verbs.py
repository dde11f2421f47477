"""What the CLI verbs call: one function per verb over ``SessionClient``, returning models.

A checkout's rules (MPS or a profile, consent, a positive TTL) are ``CheckoutArgs``'s validators in
``calque.models.session``: checked here before anything is sent, and by the daemon again."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from calque.errors import UsageError
from calque.models.session import CheckoutArgs, Session, SliceState, UsageReport
from calque.session.client.connection import NoFreeSliceError, SessionClient, typed


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
    direct: bool = False,
    lab: str | None = None,
    progress: Callable[[str], None] = lambda m: None,
) -> Session:
    """A checkout from this host's daemon itself (``--wait`` polls it): on a host of no institution, in
    degraded mode, or an admin's ``--direct`` (the CLI's ``checkout_here`` decides)."""
    args = typed(CheckoutArgs, mps=mps, profile=profile, gpu=gpu, ttl=ttl, consent=consent, direct=direct, lab=lab)
    started = time.monotonic()
    delay = 0.5
    told = False
    while True:
        try:
            return client.checkout(args)
        except NoFreeSliceError as exc:
            if not wait:
                raise
            waited = time.monotonic() - started
            if wait_timeout is not None and waited >= wait_timeout:
                # What was really waited, measured: the last try comes at the timeout, not before it.
                raise NoFreeSliceError(f"{exc} (waited {waited:.1f} s)") from exc
            if not told:
                progress(f"waiting for a free slice: {exc}")
                told = True
            time.sleep(delay if wait_timeout is None else min(delay, wait_timeout - waited))
            delay = min(delay * 1.5, 5.0)


def checkin(client: SessionClient, session_id: str | None) -> Session:
    return client.checkin(session_id)


def extend(client: SessionClient, session_id: str | None, by: str) -> Session:
    return client.extend(session_id, by)


def status(client: SessionClient) -> list[Session]:
    return client.status()


def one_session(client: SessionClient, session_id: str | None) -> Session:
    """The caller's session ``session_id``, or their only one, as the daemon has it now."""
    mine = status(client)
    if session_id is not None:
        for s in mine:
            if s.id == session_id:
                return s
        raise UsageError(f"you hold no live session {session_id}; `calque session status` lists yours")
    if len(mine) == 1:
        return mine[0]
    if not mine:
        raise UsageError("you hold no session")
    raise UsageError(f"you hold {len(mine)} sessions ({', '.join(s.id for s in mine)}); name one")


def list_slices(client: SessionClient) -> list[SliceState]:
    return client.list_slices()


def release(client: SessionClient, session_id: str, force: bool, reason: str | None = None) -> Session:
    if not force:
        raise UsageError("release ends another user's session; pass --force")
    return client.release(session_id, reason)


def report(client: SessionClient, since: str) -> UsageReport:
    return client.report(since)


def stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
