"""Generator methods on a pool: the worker writes what an item yields as numbered chunk objects, a reader follows.

A generator item's values are written as they are produced, a chunk at a time (``CHUNK_FLUSH_S``
or ``CHUNK_MAX_VALUES``, whichever comes first), to
``runs/<run>/streams/<claim>/<attempt>/<index>/chunk-000001.json`` (a JSON list of values), where
``<attempt>`` is the delivery's receive count: an attempt that lost its lease never writes into the
stream of the one that completes the claim. The item's ItemResult (``{"chunks": k, "values": n}``, or
the exception that ended it) and the claim's Summary come after its last chunk, so a reader that
has the Summary knows the stream is complete: ``follow`` yields values as chunks appear, then
checks the count the Summary vouches for, or raises the item's exception after the values yielded
before it.
"""

from __future__ import annotations

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
    without a new chunk or the Summary. Ends when the Summary vouches for every chunk read.
    """
    attempt: int | None = None  # the attempt followed: the newest one seen until the Summary names one
    number, interval, last = 1, _FIRST_POLL_S, time.monotonic()
    base = f"{results_prefix}streams/{claim_id}/"
    while True:
        summary = store.get_summary(results_prefix, claim_id)
        if summary is not None:
            if attempt is not None and attempt != summary.attempt and number > 1:
                raise InfrastructureError(
                    f"claim {claim_id}: the stream was restarted by another delivery (attempt {summary.attempt}) "
                    f"after {number - 1} chunk(s) of attempt {attempt} had been read; call it again"
                )
            prefix = stream_prefix(results_prefix, claim_id, summary.attempt)
            while (data := store.get(chunk_uri(prefix, index, number))) is not None:
                yield from json.loads(data)
                number += 1
            results = store.claim_results(results_prefix, summary, range(index, index + 1))
            result = next(r for r in results if r.index == index)
            if on_result is not None:
                on_result(summary, result)
            if result.ok:
                chunks = result.value.get("chunks") if isinstance(result.value, dict) else None
                if chunks != number - 1:
                    raise InfrastructureError(
                        f"claim {claim_id}: the Summary vouches for {chunks} chunk(s), {number - 1} were found"
                    )
            return
        if attempt is None:
            attempts = sorted(int(k.split("/")[-3]) for k in store.keys(base) if k.endswith(".json"))
            attempt = attempts[-1] if attempts else None
        uri = None if attempt is None else chunk_uri(stream_prefix(results_prefix, claim_id, attempt), index, number)
        data = None if uri is None else store.get(uri)
        if data is not None:
            yield from json.loads(data)
            number, interval, last = number + 1, _FIRST_POLL_S, time.monotonic()
            continue
        if check is not None:
            check()
        if time.monotonic() - last > timeout_s:
            raise InfrastructureError(
                f"claim {claim_id}: no chunk and no Summary for {timeout_s:g}s ({number - 1} chunk(s) read)"
            )
        time.sleep(interval)
        interval = min(interval * 1.3, _MAX_POLL_S)
