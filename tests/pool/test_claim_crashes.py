"""A claim that ends its worker outright is poisoned before it ends a third; what a method returns never
ends one (``calque pool submit``'s JSON runs included)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pool.conftest import PROC_WAIT, Pool, wait_until

pytestmark = pytest.mark.slow

SCRIPT = """import os

import modal

app = modal.App("crashes")


@app.function()
def work(x):
    if x == "die":
        os._exit(3)  # no Python error to catch: the process just ends, as under a segfault or the OOM killer
    if x == "bytes":
        return b"\\x89PNG\\xff"  # not JSON, not UTF-8: before, this escaped the supervisor and ended the worker
    return x
"""


def test_a_claim_that_ends_two_workers_is_poisoned_before_a_third(make_pool, tmp_path: Path) -> None:
    script = tmp_path / "crashes.py"
    script.write_text(SCRIPT)
    pool: Pool = make_pool(workload=str(script), model="org/crashes", vt=4)
    record = pool.submit([{"args": ["die"]}], method="work", batch_size=1)
    for _ in (1, 2):  # each worker takes the claim (the second after the first one's VT) and ends with it
        w = pool.start()
        assert w.proc.wait(timeout=PROC_WAIT + 10) == 3, w.stderr()
    third = pool.start()
    (summary,) = pool.wait_run(record).values()
    assert not summary.ok and summary.attempt == 3
    assert "this claim ended two workers in a row: attempts 1 and 2" in (summary.error or ""), summary.error
    assert "it is not offered to a third" in (summary.error or "")
    (result,) = pool.store.results(record)
    assert not result.ok and "ended two workers in a row" in (result.error.message if result.error else "")
    # the third worker never ran it, and keeps serving
    ok = pool.submit([{"args": ["fine"]}, {"args": ["bytes"]}], method="work", batch_size=2)
    (summary,) = pool.wait_run(ok).values()
    first, second = pool.store.results(ok)
    assert first.ok and first.value == "fine"
    assert not second.ok and second.error is not None and second.error.type == "TypeError"
    assert "the value work returned: the method returned a bytes, which is not JSON-serialisable" in (
        second.error.message
    )
    assert third.proc.poll() is None, third.stderr()
    wait_until(lambda: "serving" in third.stderr(), PROC_WAIT, "the third worker serving")
