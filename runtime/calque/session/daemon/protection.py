"""A fleet host's checkout waits for scale-in protection (``session/scalein.py``): with
``scale_in_guard`` set, a checkout is granted only while the fleet helper says the instance is
protected, under the lock the helper lifts protection under, so the group never picks (and ends) a
host that holds a session. Unprotected, the checkout asks the helper and waits up to
``scale_in_wait``; past that it is refused, naming the helper."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from calque.session.daemon.wire import RequestError
from calque.session.scalein import ScaleInGuard
from calque.session.session_config import SessionConfig

ASK_EVERY_S = 0.02


@contextmanager
def protected(config: SessionConfig) -> Iterator[None]:
    if config.scale_in_guard is None:
        yield
        return
    guard = ScaleInGuard(config.scale_in_guard)
    deadline = time.monotonic() + config.scale_in_wait
    while True:
        with guard.locked():
            if guard.protected():
                yield  # the grant, while the helper cannot lift the protection
                guard.mark("granted")  # after the commit: a helper that counted before sees it now
                return
        guard.mark("wanted")
        if time.monotonic() >= deadline:
            raise RequestError(
                "refused",
                f"this host is not protected from scale-in and its fleet helper did not protect it within "
                f"{config.scale_in_wait:g} s (is calque-session-fleet.service running?); try again or another host",
            )
        time.sleep(ASK_EVERY_S)
