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


def until(check: Callable[[], T], what: str | Callable[[], str], *, ceiling: float = HANG_S, every: float = 0.1) -> T:
    """Poll ``check()`` until it returns something truthy, and return that.

    ``what`` names the awaited event ("the scope is gone", "the worker is serving"); a callable is
    called only on failure, for a message with what was last seen. Only past ``ceiling`` seconds (by
    default ``HANG_S``, a hang) does it raise an ``AssertionError`` that names ``what`` and how long it
    waited; the last check starts after the ceiling, so a slow poll is never cut short by the clock.
    """
    start = time.monotonic()
    while True:
        past = time.monotonic() - start >= ceiling  # read before the check: the last one starts past the ceiling
        got = check()
        if got:
            return got
        if past:
            said = what() if callable(what) else what
            raise AssertionError(f"{said}: still not so after {time.monotonic() - start:.1f} s (a hang)")
        time.sleep(every)
