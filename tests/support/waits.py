"""Waiting in a test: the event decides, never a time.

The suite runs on loaded machines (two cores, a load average of ten), where anything can take many
times its usual time. A test that waits "at most 10 s" for a file, a socket, a log line, a row, a
unit state or a process to end fails there although nothing is wrong. So every positive wait in a
test polls for the event itself and gives up only at ``HANG_S``, a ceiling that only a hang
reaches: it exists so that a test that would never pass ends with a message naming what it waited
for, instead of running until CI kills it. How fast something happens is a timing goal, and timing
goals live in the benchmarks (``bench/``), not in the tests.

Checks that something does *not* happen within a window ("still alive after 2 s", "no message in
1 s") are not waits: load can only make them pass, and they keep their short windows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

HANG_S = float(os.environ.get("CALQUE_TEST_HANG_S", "300"))
"""Seconds after which a positive wait is called a hang (``CALQUE_TEST_HANG_S`` overrides it)."""

MAX_PAUSE_S = 1.0
LATE_SHARE = 0.05  # a wait that has lasted T seconds sees its event at most this share of T late


def pause(every: float, took: float, waited: float) -> float:
    """How long to sleep between two checks of a wait: ``every`` at first; at least as long as the last
    check took, so that checking (often a command: a CLI call, an ssh, a list of the broker) uses at most
    half of a core the awaited event needs on a loaded machine; and, as the wait goes on, up to
    ``LATE_SHARE`` of what it has lasted (never over ``MAX_PAUSE_S``). A full run with checks every 50 ms
    whatever they cost spent more CPU the slower it went: polling grew with the waiting it caused."""
    return min(max(every, took, waited * LATE_SHARE), MAX_PAUSE_S)


def until(check: Callable[[], T], what: str | Callable[[], str], *, ceiling: float = HANG_S, every: float = 0.1) -> T:
    """Poll ``check()`` until it returns something truthy, and return that.

    ``what`` names the awaited event ("the scope is gone", "the worker is serving"); a callable is
    called only on failure, for a message with what was last seen. Only past ``ceiling`` seconds (by
    default ``HANG_S``, a hang) does it raise an ``AssertionError`` that names ``what`` and how long it
    waited; the last check starts after the ceiling, so a slow poll is never cut short by the clock.
    """
    start = time.monotonic()
    while True:
        asked = time.monotonic()
        past = asked - start >= ceiling  # read before the check: the last one starts past the ceiling
        got = check()
        if got:
            return got
        if past:
            said = what() if callable(what) else what
            raise AssertionError(f"{said}: still not so after {time.monotonic() - start:.1f} s (a hang)")
        now = time.monotonic()
        time.sleep(pause(every, now - asked, now - start))
