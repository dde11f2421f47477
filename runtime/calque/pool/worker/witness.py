"""The witness: a worker process's parent, which outlives it and says whether a claim's item ended it.

A method can end its process outright (``os._exit``, a segfault in C code, the OOM killer taking
the process that holds the model), and nothing in that process survives to say so. Nor can the
next worker tell that apart from the whole worker being killed (``kill -9``, a spot reclaim, an
operator), in which case the claims it held did nothing wrong. So ``calque pool worker`` forks: the
parent, this witness, does nothing but watch; the child is the worker as it always was (load,
``@enter``, claim, drain, write), and tells the witness over a pipe, one short line at a time:

- which items of which claim (and attempt) are running, as they start, and when the drain ends;
- that it is stopping and why (SIGTERM, a spot notice, the drain hook, idle, its own fatal error):
  such an end releases what it holds and is never evidence against a claim.

When the worker dies without having said it is stopping, by a signal or a non-zero exit, while an
item ran, the witness writes a ``CrashMark`` naming the claim's attempt, the items and the cause
(``calque.pool.worker.crashes``); then it exits as its worker did. Prefetched claims, and claims the
worker released, are never marked. When the witness itself is killed (``kill -9`` of the worker's
pid, what systemd and operators see), the worker dies with it (``PR_SET_PDEATHSIG``) and nothing
is marked: the whole worker vanished, and its claims come back to run again.

The lines cost a pipe write each (no network): nothing on a claim's path waits for a store.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, NoReturn, TypeVar

from calque.aws.store import RunStore
from calque.models.poolcrash import CrashMark
from calque.pool.worker.crashes import record_death

log = logging.getLogger("calque.pool.worker.witness")
T = TypeVar("T")
_MAX_ITEMS = 64  # named in a line; keeps every line under PIPE_BUF, so each write is atomic
_FORWARDED = (signal.SIGTERM, signal.SIGINT)
# signals a witness re-raises on itself to end as its worker did; for the rest (core-dumping
# ones) it exits 128 + the signal instead, so it never leaves a core of its own
_RERAISED = (signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGHUP)


class WitnessLine:
    """The worker's end of the pipe to its witness (``fd`` None: no witness, every call does nothing)."""

    def __init__(self, fd: int | None = None) -> None:
        self._fd = fd

    def running(self, results_prefix: str, claim_id: str, attempt: int, items: list[int]) -> None:
        """Items ``items`` of ``claim_id``'s attempt ``attempt`` are what runs now."""
        if self._fd is not None:
            run = {"prefix": results_prefix, "claim": claim_id, "attempt": attempt, "items": items[:_MAX_ITEMS]}
            self._say({"run": run})

    def idle(self) -> None:
        """No item runs now (the drain ended)."""
        if self._fd is not None:
            self._say({"run": None})

    def stopping(self, reason: str) -> None:
        """The worker ends on purpose: whatever happens next is no claim's doing. Safe in a signal handler."""
        if self._fd is not None:
            self._say({"stop": reason[:200]})

    def _say(self, msg: dict[str, Any]) -> None:
        fd = self._fd
        if fd is None:
            return
        try:
            os.write(fd, json.dumps(msg).encode() + b"\n")  # one write under PIPE_BUF: atomic, no lock needed
        except OSError:  # the witness is gone (this process is about to be killed with it)
            self._fd = None


NO_WITNESS = WitnessLine()


class _Testimony:
    """What the witness heard last: the running items, and whether the worker said it is stopping."""

    def __init__(self) -> None:
        self.running: dict[str, Any] | None = None
        self.stopping: str | None = None
        self._tail = b""

    def hear(self, data: bytes) -> None:
        *lines, self._tail = (self._tail + data).split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "stop" in msg:
                self.stopping = str(msg["stop"])
            if "run" in msg:
                self.running = msg["run"]


def witnessed(serve: Callable[[WitnessLine], T], *, worker_id: str, store: Callable[[], RunStore]) -> T:
    """Run ``serve`` in a child worker process watched by this one; in the child, ``serve``'s result.

    In this process (the witness) it never returns: it exits as the worker did, once it has written
    the mark a worker that died running an item leaves. ``store`` opens the store for that mark
    (called only then: the witness makes no client unless it has something to say).
    """
    if not hasattr(os, "fork"):
        return serve(NO_WITNESS)
    witness_pid = os.getpid()
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _die_with(witness_pid)
        return serve(WitnessLine(write_fd))
    os.close(write_fd)
    _watch(pid, read_fd, worker_id, store)


def _die_with(witness_pid: int) -> None:
    """The worker dies when its witness does: a killed worker is the witness's pid, and takes its child along."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
            _poll_parent(witness_pid)
    else:
        _poll_parent(witness_pid)
    if os.getppid() != witness_pid:  # it died before the line above took effect
        os._exit(1)


def _poll_parent(witness_pid: int) -> None:
    def loop() -> None:
        while os.getppid() == witness_pid:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=loop, name="calque-witness-poll", daemon=True).start()


def _watch(pid: int, fd: int, worker_id: str, store: Callable[[], RunStore]) -> NoReturn:
    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile: nothing to forward to
            os.kill(pid, signum)

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    heard = _Testimony()
    status = _listen(pid, fd, heard)
    code = os.waitstatus_to_exitcode(status)
    cause = _cause(code)
    if cause is not None and heard.stopping is None and heard.running is not None:
        _testify(heard.running, cause, worker_id, store)
    _exit_as(code)


def _listen(pid: int, fd: int, heard: _Testimony) -> int:
    """Hear the worker until it ends; its wait status."""
    open_ = True
    while True:
        if open_:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                data = os.read(fd, 65536)
                if data:
                    heard.hear(data)
                else:
                    open_ = False
        done, status = os.waitpid(pid, 0 if not open_ else os.WNOHANG)
        if done:
            break
    os.set_blocking(fd, False)  # what it said just before it died is still in the pipe
    while open_:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:  # a process it forked still holds the pipe open
            break
        if not data:
            break
        heard.hear(data)
    os.close(fd)
    return status


def _cause(code: int) -> str | None:
    """How the worker died, or None when it exited 0."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return None if code == 0 else f"exited with code {code}"


def _testify(running: dict[str, Any], cause: str, worker_id: str, store: Callable[[], RunStore]) -> None:
    try:
        mark = CrashMark(
            claim_id=running["claim"],
            attempt=running["attempt"],
            worker_id=worker_id,
            items=running["items"],
            cause=cause,
            at=datetime.now(timezone.utc),
        )
        prefix = str(running["prefix"])
    except (KeyError, TypeError, ValueError) as exc:  # a garbled line: no evidence
        log.warning("the worker died (%s) but what it ran cannot be read: %s", cause, exc)
        return
    log.warning(
        "the worker %s while running items %s of claim %s (attempt %d): marked against the claim",
        cause,
        mark.items,
        mark.claim_id,
        mark.attempt,
    )
    try:
        record_death(store(), prefix, mark)
    except Exception as exc:  # the witness must still exit as its worker did
        log.warning("could not open the store to mark claim %s: %s", mark.claim_id, exc)


def _exit_as(code: int) -> NoReturn:
    logging.shutdown()
    if code < 0 and -code in _RERAISED:
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(5)  # the signal ends this process; the exit below only if it was blocked
    os._exit(128 - code if code < 0 else code)
