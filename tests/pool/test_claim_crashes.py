"""A claim is blamed only for the deaths its own items caused (issue 35).

A worker's witness (its parent process) marks a claim when the worker died while that claim's item
ran; a claim with two marks is poisoned naming the item. Claims that were only prefetched, given
back on purpose (SIGTERM, a spot notice) or held by a worker killed as a whole carry no mark and run
again. Real worker processes on the session moto server.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest

from pool.conftest import PROC_WAIT, RUN_WAIT, FakeImds, Pool, WorkerProc, wait_until

pytestmark = pytest.mark.slow

SCRIPT = """import ctypes
import os
import time

import modal

app = modal.App("crashes")


@app.function()
def work(x):
    if x == "exit":
        os._exit(3)  # no Python error to catch: the process just ends
    if x == "segv":
        ctypes.string_at(0)  # a C-level crash: SIGSEGV
    if x == "bytes":
        return b"\\x89PNG\\xff"  # not JSON, not UTF-8: before, this escaped the supervisor and ended the worker
    if x == "slow":
        time.sleep(0.3)  # the claim runs long enough for the receiver to hold the next one ahead
    return x
"""
KILLER = 17  # of 40 items in claims of 5: item 2 of claim c00003
SLOW = {"STEADY_DELAY_SCALE": "60"}  # the steady workload's delay 0.5 becomes 30 s: always mid-claim
FAST = {"STEADY_DELAY_SCALE": "0.1"}


def _serve_until_done(pool: Pool, claims: int, prefix: str) -> None:
    """Keep one worker serving, a new one each time the last one died, until every claim has a Summary."""

    def step() -> bool:
        if not pool.workers or pool.workers[-1].proc.poll() is not None:
            pool.start()
        return pool.store.summary_count(prefix) >= claims

    wait_until(step, RUN_WAIT, "every Summary, with a worker started after each death", interval=0.3)


def _marked(pool: Pool, prefix: str) -> list[str]:
    return pool.store.keys(prefix + "running/")


@pytest.mark.parametrize(
    ("killer", "cause", "code"),
    [("exit", "exited with code 3", 3), ("segv", "killed by SIGSEGV", 128 + signal.SIGSEGV)],
    ids=["os._exit", "segfault"],
)
def test_the_claim_whose_item_ends_two_workers_is_poisoned_naming_it_and_the_claims_behind_it_succeed(
    make_pool, tmp_path: Path, killer: str, cause: str, code: int
) -> None:
    script = tmp_path / "crashes.py"
    script.write_text(SCRIPT)
    # max_receive_count 2, as the operator who found it had: a prefetched claim held by two dying
    # workers came back as attempt 3 and was failed for it
    pool: Pool = make_pool(workload=str(script), model="org/crashes", vt=4, max_receive_count=2)
    values = [killer if i == KILLER else "slow" if i in (15, 16) else f"v{i}" for i in range(40)]
    record = pool.submit([{"args": [v]} for v in values], method="work", batch_size=5)
    _serve_until_done(pool, len(record.claims), record.results_prefix)

    dead = [w for w in pool.workers if w.proc.poll() is not None]
    assert [w.proc.returncode for w in dead] == [code, code], [w.stderr()[-2000:] for w in dead]
    summaries = pool.summaries(record)
    poisoned = summaries.pop("c00003")
    assert not poisoned.ok and poisoned.attempt == 3
    error = poisoned.error or ""
    assert f"this claim ended two workers while its item {KILLER} ran" in error, error
    assert f"attempt 1 on worker {dead[0].worker_id}: {cause}" in error, error
    assert f"attempt 2 on worker {dead[1].worker_id}: {cause}" in error, error
    assert "it is not offered to a third" in error and f"Run item {KILLER} with calque run --local" in error
    # every other claim ran and succeeded, one of them after the worker holding it ahead died
    assert all(s.ok for s in summaries.values()), {c: s.error for c, s in summaries.items() if not s.ok}
    assert any(s.attempt > 1 for s in summaries.values()), "no claim was held behind the killer"
    results = pool.store.results(record)
    assert [r.index for r in results] == list(range(40))
    for r in results:
        if 15 <= r.index < 20:
            assert not r.ok and r.error is not None and r.error.type == "calque.ClaimFailed"
            assert f"item {KILLER} ran" in r.error.message
        else:
            assert r.ok and r.value == values[r.index], r
    # only the killer's two attempts were marked
    assert [k.rsplit("/", 2)[-2:] for k in _marked(pool, record.results_prefix)] == [
        ["c00003", "0001.json"],
        ["c00003", "0002.json"],
    ]
    # the third worker never ran it, keeps serving, and what a method returns never ends it
    third = pool.workers[-1]
    ok = pool.submit([{"args": ["fine"]}, {"args": ["bytes"]}], method="work", batch_size=2)
    pool.wait_run(ok)
    first, second = pool.store.results(ok)
    assert first.ok and first.value == "fine"
    assert not second.ok and second.error is not None and second.error.type == "TypeError"
    assert "the method returned a bytes, which is not JSON-serialisable" in second.error.message
    assert third.proc.poll() is None, third.stderr()


def test_a_kill_9_a_sigterm_and_a_spot_notice_mid_claim_never_count(make_pool, fake_imds: FakeImds) -> None:
    # max_receive_count 1: a single death its item caused would poison the claim
    pool: Pool = make_pool(vt=4, max_receive_count=1)
    record = pool.submit([{"args": [0], "kwargs": {"delay": 0.5}}], batch_size=1)
    killed = pool.start(env=SLOW)
    killed.wait_log("start 0", stream="stdout")
    killed.proc.send_signal(signal.SIGKILL)  # the whole worker (its witness) killed: no evidence
    killed.proc.wait(timeout=PROC_WAIT)
    termed = pool.start(env=SLOW)
    termed.wait_log("start 0", stream="stdout")  # attempt 2, after the killed worker's VT
    termed.proc.send_signal(signal.SIGTERM)
    assert termed.proc.wait(timeout=PROC_WAIT) == 0, termed.stderr()
    assert "released message" in termed.stderr()
    spotted = pool.start(env=SLOW, spot_watch=True, imds_endpoint=fake_imds.url, spot_poll_s=0.3)
    spotted.wait_log("start 0", stream="stdout")
    fake_imds.notice = True
    assert spotted.proc.wait(timeout=PROC_WAIT) == 0, spotted.stderr()
    assert "released message" in spotted.stderr()
    fake_imds.notice = False
    final = pool.start(env=FAST)
    (summary,) = pool.wait_run(record).values()
    assert summary.ok and summary.worker_id == final.worker_id
    assert summary.attempt == 2  # the kill's receive counted on SQS; the two releases did not
    assert _marked(pool, record.results_prefix) == []


def test_ten_kill_9s_over_2000_items_lose_duplicate_and_fail_nothing(make_pool) -> None:
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    # max_receive_count 2, as the operator had: two killed workers that held a claim used to fail it
    pool: Pool = make_pool(vt=5, max_receive_count=2)
    n = 2000
    record = pool.submit([{"args": [i], "kwargs": {"delay": 0.03}} for i in range(n)], batch_size=10)
    pool.start()
    pool.start()
    for kill in range(10):
        live = [w for w in pool.workers if w.proc.poll() is None]
        victim: WorkerProc = rng.choice(live)
        victim.wait_log("serving")
        time.sleep(rng.uniform(0.2, 1.5))  # a random moment of its serving, not a wait for anything
        done = pool.store.summary_count(record.results_prefix)
        assert done < len(record.claims), f"the run finished before kill {kill + 1} (seed {seed})"
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=PROC_WAIT)
        pool.start()
    summaries = pool.wait_run(record)
    assert not [c for c, s in summaries.items() if not s.ok], f"failed claims (seed {seed})"
    results = pool.store.results(record)
    assert [r.index for r in results] == list(range(n)), f"lost or duplicated items (seed {seed})"
    wrong = [r.index for r in results if not r.ok or r.value is None or r.value["x"] != r.index]
    assert wrong == [], f"wrong items (seed {seed})"
    assert _marked(pool, record.results_prefix) == []
