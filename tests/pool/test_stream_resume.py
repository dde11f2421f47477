"""A reader following a generator's stream rides out a redelivery: it moves to the new attempt and
yields only what comes after the values it already had, once the new attempt has repeated them.

The stream is written as a worker writes it (chunk objects per attempt, the attempt's results, the
Summary) into a real bucket on the moto server; ``follow`` reads it with the real RunStore.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from typing import Any

import pytest
from calque.aws.clients import client
from calque.aws.store import RunStore
from calque.errors import InfrastructureError
from calque.models import ItemResult, Summary
from calque.pool.worker.stream import chunk_uri, follow, stream_prefix
from support.waits import HANG_S

CLAIM = "c-0001"


def _store() -> tuple[RunStore, str]:
    s3 = client("s3")
    s3.create_bucket(Bucket="streams")
    store = RunStore(s3, "streams", "calque", "q")
    return store, store.run_prefix("run-1")


def _chunks(store: RunStore, prefix: str, attempt: int, chunks: list[list[Any]]) -> None:
    where = stream_prefix(prefix, CLAIM, attempt)
    for number, values in enumerate(chunks, start=1):
        store.put(chunk_uri(where, 0, number), json.dumps(values).encode())


def _finish(store: RunStore, prefix: str, attempt: int, chunks: list[list[Any]]) -> None:
    """The attempt's results and its Summary, written after its last chunk (as the worker does)."""
    key = f"results/{CLAIM}/{attempt}-w-t.jsonl"
    value = {"chunks": len(chunks), "values": sum(map(len, chunks))}
    store.put_results(prefix, CLAIM, [ItemResult(index=0, ok=True, value=value, seconds=0.1)], key)
    now = datetime.now(timezone.utc)
    summary = Summary(
        run_id="run-1", claim_id=CLAIM, model="m", method="g", ok=True, items=1, failed=0, warm_hit=True,
        enter_seconds_paid=0.0, enter_count=1, attempt=attempt, worker_id="w", started_at=now, finished_at=now,
        claim_seconds=0.1, method_seconds=0.1, results_key=key,
    )  # fmt: skip
    store.put_summary(prefix, summary)


def _reader(store: RunStore, prefix: str) -> tuple[list[Any], list[BaseException], threading.Thread]:
    got: list[Any] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            got.extend(follow(store, prefix, CLAIM, index=0, timeout_s=HANG_S))
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return got, errors, t


def _until(pred: Any, timeout: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"not so in {timeout:g} s (a hang)"
        time.sleep(0.02)


def test_a_redelivered_stream_resumes_after_what_was_read(moto: str) -> None:
    store, prefix = _store()
    _chunks(store, prefix, 1, [[0, 1], [2]])  # attempt 1 wrote three values, then its worker died
    got, errors, t = _reader(store, prefix)
    _until(lambda: len(got) == 3)
    # Attempt 2 runs the generator again from the start, and goes further.
    again = [[0], [1, 2, 3], [4, 5]]
    _chunks(store, prefix, 2, again)
    _until(lambda: len(got) == 6)  # found without its Summary: the quiet attempt made the reader look
    _finish(store, prefix, 2, again)
    t.join(HANG_S)
    assert not errors, errors
    assert got == [0, 1, 2, 3, 4, 5]  # each value once, in order


def test_a_redelivered_stream_that_differs_is_an_error_naming_where(moto: str) -> None:
    store, prefix = _store()
    _chunks(store, prefix, 1, [[{"v": 0.11}, {"v": 0.72}]])
    got, errors, t = _reader(store, prefix)
    _until(lambda: len(got) == 2)
    again = [[{"v": 0.11}, {"v": 0.35}, {"v": 0.9}]]  # not the same values: a random generator
    _chunks(store, prefix, 2, again)
    _finish(store, prefix, 2, again)
    t.join(HANG_S)
    assert got == [{"v": 0.11}, {"v": 0.72}]
    (err,) = errors
    assert isinstance(err, InfrastructureError)
    assert "value 2 differs from the one already read" in str(err) and "cannot be resumed" in str(err)


def test_a_redelivered_stream_that_yields_less_than_was_read_is_an_error(moto: str) -> None:
    store, prefix = _store()
    _chunks(store, prefix, 1, [[0, 1, 2]])
    got, errors, t = _reader(store, prefix)
    _until(lambda: len(got) == 3)
    _chunks(store, prefix, 2, [[0, 1]])
    _finish(store, prefix, 2, [[0, 1]])
    t.join(HANG_S)
    (err,) = errors
    with pytest.raises(InfrastructureError, match=r"yielded 2 value\(s\) where 3 had already been read"):
        raise err
