"""The registry's writer: every daemon process's changes to the SQLite file, group-committed.

Apart from the registry's queries because it knows nothing of sessions: it takes a change (a function
of the write connection), runs it in a transaction with whatever other changes are queued, and returns
only once that transaction is on disk. ``BEGIN IMMEDIATE`` under a lock held across processes
serialises the writers without SQLite's busy back-off sleeps between them.
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from calque.session.daemon.hostlock import HostLock

T = TypeVar("T")
MAX_BATCH = 256


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the registry file in WAL mode with synchronous=FULL (a commit is on disk)."""
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA busy_timeout=30000")
    return db


class GroupCommit:
    """Thread-safe, with group commit. A writer queues its change; whichever writer holds the commit
    lock runs every queued change, each in its own savepoint, inside one transaction and commits
    once. A burst of clients costs one fsync instead of one each, a lone client pays no hand-off to
    another thread, and no caller returns before its change is durable."""

    def __init__(self, db: sqlite3.Connection, lock: HostLock) -> None:
        self.db = db  # the write connection: only the commit lock's holder uses it
        self.lock = lock  # serialises writers of every daemon process
        self._queue: queue.SimpleQueue[tuple[Callable[[sqlite3.Connection], Any], Future[Any]]] = queue.SimpleQueue()

    def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn``'s result once the transaction that ran it has committed (its exception, if it raised)."""
        fut: Future[T] = Future()
        self._queue.put((fn, fut))
        while not fut.done():
            with self.lock.unless(fut.done) as mine:
                if mine:
                    self._commit_batch()
        return fut.result()

    def _commit_batch(self) -> None:
        """Run and commit everything queued so far (called with the commit lock held)."""
        db = self.db
        batch: list[tuple[Callable[[sqlite3.Connection], Any], Future[Any]]] = []
        while len(batch) < MAX_BATCH:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if not batch:
            return
        outcomes: list[tuple[Future[Any], Any, BaseException | None]] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            if len(batch) == 1:  # alone: its own failure may roll the whole transaction back
                fn, fut = batch[0]
                try:
                    outcomes.append((fut, fn(db), None))
                except Exception as exc:
                    db.execute("ROLLBACK")
                    fut.set_exception(exc)
                    return
                batch_rest: list[tuple[Callable[[sqlite3.Connection], Any], Future[Any]]] = []
            else:
                batch_rest = batch
            for fn, fut in batch_rest:
                db.execute("SAVEPOINT op")
                try:
                    result = fn(db)
                except Exception as exc:
                    db.execute("ROLLBACK TO op")
                    db.execute("RELEASE op")
                    outcomes.append((fut, None, exc))
                else:
                    db.execute("RELEASE op")
                    outcomes.append((fut, result, None))
            db.execute("COMMIT")
        except BaseException as exc:
            # Nothing of this batch is on disk: every caller in it gets the error (none waits forever).
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            for _, fut in batch:
                fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
        else:
            for fut, result, err in outcomes:
                if err is not None:
                    fut.set_exception(err)
                else:
                    fut.set_result(result)
