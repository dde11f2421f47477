"""Running a generator method for one item: its values go to a sink in numbered chunks while it runs.

``Chunker`` buffers what the generator yields and hands the buffer to the sink at most every
``flush_s`` (a timer flushes a value the generator yielded before a long pause, so a reader sees it
without waiting for the next one) or when it holds ``max_values``; ``close`` flushes the rest and
waits for every chunk to be handed over, so whatever follows (the item's result, the Summary) comes
after the stream's last chunk. Chunks are numbered from 1, in order, handed over one at a time.

A sync generator cannot be interrupted from outside: when its item times out (or its claim's deadline
passes) the supervisor ``cut``s its chunker. From then on nothing more reaches the sink (a chunk being
handed over is waited for, so the item's result comes after every chunk of the stream), and at the
generator's next value the runner stops and closes it (``GeneratorExit`` inside it: its ``finally``
runs), so its thread ends instead of computing for nobody.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic_core import to_jsonable_python

from calque.models import Item

Sink = Callable[[int, int, list[Any]], None]  # (item index, chunk number, values)
Carry = Callable[[Any], Any]  # a yielded value as it travels (calque.models.values, or plain JSON)
CUT_WAIT_S = 10.0  # how long a cut waits for a chunk already being handed over


class StreamCut(BaseException):  # like GeneratorExit: not an Exception a method catches by accident
    """Raised at a cut generator's next value: its item was abandoned (item timeout, claim deadline or
    the worker stopping), so nothing it yields is kept any more."""


class Chunker:
    def __init__(
        self, sink: Sink, index: int, *, flush_s: float = 0.2, max_values: int = 256, carry: Carry = to_jsonable_python
    ) -> None:
        self.sink, self.index, self.flush_s, self.max_values = sink, index, flush_s, max_values
        self.carry = carry
        self.chunks = self.values = 0
        self._buf: list[Any] = []
        self._lock = threading.Lock()  # the buffer
        self._put = threading.Lock()  # one chunk handed over at a time, in number order
        self._timer: threading.Timer | None = None
        self._last = 0.0
        self._error: BaseException | None = None
        self._cut = False

    def cut(self) -> None:
        """Keep nothing more: drop what is buffered, wait (bounded) for a chunk being handed over."""
        with self._lock:
            self._cut = True
            self._buf = []
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if self._put.acquire(timeout=CUT_WAIT_S):
            self._put.release()

    def add(self, value: Any) -> None:
        if self._cut:
            raise StreamCut("the item was abandoned (timeout, deadline or stop): this stream is closed")
        if self._error is not None:
            raise self._error
        jsonable = self.carry(value)
        with self._lock:
            self._buf.append(jsonable)
            self.values += 1
            due = len(self._buf) >= self.max_values or time.monotonic() - self._last >= self.flush_s
            if not due and self._timer is None:
                self._timer = threading.Timer(self.flush_s, self._flush_quietly)
                self._timer.daemon = True
                self._timer.start()
        if due:
            self.flush()

    def _flush_quietly(self) -> None:
        try:
            self.flush()
        except BaseException as exc:  # raised to the generator's thread at its next value, or at close
            self._error = exc

    def flush(self) -> None:
        with self._put:
            with self._lock:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                values, self._buf = self._buf, []
                if not values or self._cut:
                    return
                self.chunks += 1
                number = self.chunks
                self._last = time.monotonic()
            self.sink(self.index, number, values)

    def close(self) -> dict[str, int]:
        """Flush the rest; the item's value: how many chunks and values the stream holds."""
        self.flush()
        if self._error is not None:
            raise self._error
        return {"chunks": self.chunks, "values": self.values}


def generator_runner(
    fn: Any, item: Item, sink: Sink | None, *, is_async: bool, carry: Carry = to_jsonable_python
) -> tuple[Callable[[], Any], Callable[[], None]]:
    """``(run, cut)``: ``run`` runs generator ``fn`` for ``item``, its values to ``sink`` in chunks, and
    returns their count; ``cut`` ends the stream from outside (the item timed out).

    Values yielded before an exception still reach the sink (the reader yields them, then raises).
    With no sink (``run`` in-process), the item's value is the list of the values.
    """
    chunker = Chunker(sink, item.index, carry=carry) if sink is not None else None
    collected: list[Any] = []
    add = chunker.add if chunker is not None else collected.append

    def finish() -> Any:
        return chunker.close() if chunker is not None else list(collected)  # the item's value: carried by its result

    def end_early() -> None:
        if chunker is not None:
            chunker.flush()

    def cut() -> None:
        if chunker is not None:
            chunker.cut()

    if is_async:

        async def run_async() -> Any:
            agen = fn(*item.args, **item.kwargs)
            try:
                async for value in agen:
                    add(value)
            except BaseException:
                end_early()
                raise
            finally:
                await agen.aclose()
            return finish()

        return run_async, cut

    def run() -> Any:
        gen = fn(*item.args, **item.kwargs)
        try:
            for value in gen:
                add(value)
        except BaseException:
            end_early()
            raise
        finally:
            gen.close()
        return finish()

    return run, cut
