"""Generator methods on a pool: the worker writes what an item yields as numbered chunk objects, a reader follows.

A generator item's values are written as they are produced, a chunk at a time (``CHUNK_FLUSH_S``
or ``CHUNK_MAX_VALUES``, whichever comes first), to
``runs/<run>/streams/<claim>/<attempt>/<index>/chunk-000001.json`` (a JSON list of values), where
``<attempt>`` is the delivery's receive count: an attempt that lost its lease never writes into the
stream of the one that completes the claim. The item's ItemResult (``{"chunks": k, "values": n}``, or
the exception that ended it) and the claim's Summary come after its last chunk, so a reader that
has the Summary knows the stream is complete: ``follow`` yields values as chunks appear, then
checks the count the Summary vouches for, or raises the item's exception after the values yielded
before it. A redelivery mid-stream starts the generator again under a new attempt: the reader
follows that one and yields only what comes after the values it already had, once it has checked
that the new attempt repeated them.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from calque.aws.store import RunStore
from calque.errors import InfrastructureError
from calque.models import ItemResult, Summary

CHUNK_FLUSH_S = 0.2
CHUNK_MAX_VALUES = 256
_FIRST_POLL_S = 0.02
_MAX_POLL_S = 0.5
_RELIST_AFTER_S = 1.0  # quiet this long: look for a newer attempt (one LIST)

# (item index, chunk number from 1, the chunk's values): called on the generator's own thread.
ChunkSink = Callable[[int, int, list[Any]], None]


def stream_prefix(results_prefix: str, claim_id: str, attempt: int) -> str:
    return f"{results_prefix}streams/{claim_id}/{attempt:04d}/"


def chunk_uri(prefix: str, index: int, number: int) -> str:
    return f"{prefix}{index}/chunk-{number:06d}.json"


def chunk_sink(store: RunStore, results_prefix: str, claim_id: str, attempt: int) -> ChunkSink:
    """Where one attempt of a claim writes its generator items' chunks."""
    prefix = stream_prefix(results_prefix, claim_id, attempt)

    def put(index: int, number: int, values: list[Any]) -> None:
        store.put(chunk_uri(prefix, index, number), json.dumps(values, allow_nan=False).encode())

    return put


class _Tape:
    """What a reader has yielded so far (a digest per value), and where it is in the attempt it follows.

    A redelivered claim runs its generator again from the start, under a new attempt. The reader then
    follows the new attempt: its first values must be the ones already yielded (checked one by one,
    not yielded again), and only the values after them are new. A generator that does not repeat
    itself (random, time-dependent) cannot be resumed: that is an error naming where they differ.
    """

    def __init__(self, claim_id: str) -> None:
        self.claim_id = claim_id
        self.seen: list[bytes] = []
        self.attempt: int | None = None
        self.number = 1  # the next chunk of the attempt followed
        self.pos = 0  # values of the attempt followed, so far

    def switch(self, attempt: int) -> None:
        self.attempt, self.number, self.pos = attempt, 1, 0

    def play(self, values: list[Any]) -> Iterator[Any]:
        """The values of the next chunk that were not yielded before."""
        for value in values:
            digest = hashlib.blake2b(json.dumps(value, sort_keys=True).encode(), digest_size=16).digest()
            if self.pos < len(self.seen):
                if digest != self.seen[self.pos]:
                    raise InfrastructureError(
                        f"claim {self.claim_id}: the stream was restarted by another delivery (attempt "
                        f"{self.attempt}) and its value {self.pos + 1} differs from the one already read; "
                        "a generator that does not repeat itself cannot be resumed: call it again"
                    )
            else:
                self.seen.append(digest)
                yield value
            self.pos += 1
        self.number += 1


def follow(
    store: RunStore,
    results_prefix: str,
    claim_id: str,
    *,
    index: int,
    timeout_s: float,
    on_result: Callable[[Summary, ItemResult], None] | None = None,
    check: Callable[[], None] | None = None,
) -> Iterator[Any]:
    """The values item ``index`` of a one-claim run yields, in order, as its worker writes them.

    ``check`` runs while nothing arrives (e.g. the pool's load check); ``timeout_s`` bounds the time
    without a new chunk or the Summary. Ends when the Summary vouches for every chunk read. When the
    claim is redelivered mid-stream, the reader moves to the newest attempt and resumes after the
    values it already yielded (``_Tape``).
    """
    tape = _Tape(claim_id)
    interval, last, listed = _FIRST_POLL_S, time.monotonic(), 0.0
    base = f"{results_prefix}streams/{claim_id}/"
    while True:
        summary = store.get_summary(results_prefix, claim_id)
        if summary is not None:
            if tape.attempt != summary.attempt:
                tape.switch(summary.attempt)
            prefix = stream_prefix(results_prefix, claim_id, summary.attempt)
            while (data := store.get(chunk_uri(prefix, index, tape.number))) is not None:
                yield from tape.play(json.loads(data))
            results = store.claim_results(results_prefix, summary, range(index, index + 1))
            result = next(r for r in results if r.index == index)
            if on_result is not None:
                on_result(summary, result)
            if result.ok:
                chunks = result.value.get("chunks") if isinstance(result.value, dict) else None
                if chunks != tape.number - 1:
                    raise InfrastructureError(
                        f"claim {claim_id}: the Summary vouches for {chunks} chunk(s), {tape.number - 1} were found"
                    )
                if tape.pos < len(tape.seen):
                    raise InfrastructureError(
                        f"claim {claim_id}: the stream was restarted by another delivery (attempt {summary.attempt}), "
                        f"which yielded {tape.pos} value(s) where {len(tape.seen)} had already been read"
                    )
            return
        now = time.monotonic()
        # The newest attempt: at the start, and again whenever the one followed has gone quiet (its
        # worker may have died and the claim been redelivered).
        if tape.attempt is None or (now - last > _RELIST_AFTER_S and now - listed > _RELIST_AFTER_S):
            listed = now
            attempts = sorted(int(k.split("/")[-3]) for k in store.keys(base) if k.endswith(".json"))
            if attempts and (tape.attempt is None or attempts[-1] > tape.attempt):
                tape.switch(attempts[-1])
        uri = (
            None
            if tape.attempt is None
            else chunk_uri(stream_prefix(results_prefix, claim_id, tape.attempt), index, tape.number)
        )
        data = None if uri is None else store.get(uri)
        if data is not None:
            yield from tape.play(json.loads(data))
            interval, last = _FIRST_POLL_S, time.monotonic()
            continue
        if check is not None:
            check()
        if time.monotonic() - last > timeout_s:
            raise InfrastructureError(
                f"claim {claim_id}: no chunk and no Summary for {timeout_s:g}s ({len(tape.seen)} value(s) read)"
            )
        time.sleep(interval)
        interval = min(interval * 1.3, _MAX_POLL_S)
