"""The threads a warm script's sync code runs on (``supervisor.py`` submits to them)."""

from __future__ import annotations

import concurrent.futures as cf
import queue as queue_mod
import threading
from typing import Any

from calque.warm.calls import mark_remote_thread


class DaemonThreadPool:
    """A fixed pool of daemon threads running the script's sync code.

    Unlike ``ThreadPoolExecutor`` (whose threads the interpreter joins at exit), an item stuck in
    C code or a long sleep cannot keep a stopping worker alive past its bound.
    """

    def __init__(self, size: int, name: str) -> None:
        self._work: queue_mod.SimpleQueue[tuple[cf.Future[Any], Any, tuple[Any, ...], dict[str, Any]] | None]
        self._work = queue_mod.SimpleQueue()
        self._size = size
        for i in range(size):
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True).start()

    def _loop(self) -> None:
        mark_remote_thread()
        while True:
            job = self._work.get()
            if job is None:
                return
            fut, fn, args, kwargs = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                fut.set_exception(exc)

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        fut: cf.Future[Any] = cf.Future()
        self._work.put((fut, fn, args, kwargs))
        return fut

    def shutdown(self) -> None:
        """Cancel queued work and let idle threads end; a busy thread ends when its call returns."""
        while True:
            try:
                job = self._work.get_nowait()
            except queue_mod.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in range(self._size):
            self._work.put(None)
