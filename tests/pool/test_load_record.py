"""A worker that cannot load says so where submitters look, and submitters stop waiting on it.

Real worker processes against the moto server: the load record they write, their exit code and
backoff, and what `calque pool submit`, `pool status` and the waiting submitter make of it.
"""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from calque.cli.main import run
from calque.models import LoadRecord
from calque.models.pool_loads import slot_uri
from calque.pool.submitter import submit as core
from calque.pool.submitter.loads import PoolLoadError
from calque.pool.worker.loadguard import BACKOFF_MAX_S
from support.waits import HANG_S

from pool.conftest import PROC_WAIT, RUN_WAIT, Pool, wait_until

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
FAILING_ENTER = CORPUS / "failing_enter.py"
MISSING_IMPORT = CORPUS / "missing_import.py"


def _cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(args)
    out, err = capsys.readouterr()
    return code, out, err


def _records(pool: Pool) -> list[LoadRecord]:
    return [LoadRecord.model_validate_json(pool.store.get(uri) or b"") for uri in _record_uris(pool)]


def _record_uris(pool: Pool) -> list[str]:
    prefix = slot_uri(pool.store, "x").rsplit("/", 1)[0] + "/"
    return [f"s3://{pool.bucket}/{k}" for k in pool.store._keys(prefix)]


def _items(tmp: Path, n: int) -> Path:
    path = tmp / f"items-{time.monotonic_ns()}.jsonl"
    path.write_text("".join(f"{i}\n" for i in range(n)))
    return path


def test_a_worker_whose_enter_raises_records_the_error_and_exits_3(make_pool) -> None:
    pool = make_pool(workload=f"{FAILING_ENTER}::Broken", model="load/enter")
    w = pool.start()
    assert w.proc.wait(timeout=PROC_WAIT) == 3, w.stderr()  # infrastructure, not 2 (usage)
    (rec,) = _records(pool)
    assert rec.state == "failed" and rec.failures == 1 and rec.retry_in_s == 0
    assert rec.error and "weights not found at /weights/model.bin" in rec.error
    assert rec.traceback and "RuntimeError: weights not found" in rec.traceback
    assert rec.worker_id.endswith(f":{w.proc.pid}") and rec.methods == []
    assert "load failed (1 in a row)" in w.stderr()


def test_pool_submit_fails_up_front_with_the_scripts_error_and_sends_nothing(make_pool, capsys, tmp_path) -> None:
    pool = make_pool(workload=f"{FAILING_ENTER}::Broken", model="load/submit")
    assert pool.start().proc.wait(timeout=PROC_WAIT) == 3
    args = ["pool", "submit", "--model", pool.model, "--items", str(_items(tmp_path, 5)), "--bucket", pool.bucket]
    # Its own wait would last a hang's time: it fails before sending anything, so before any wait.
    code, _, err = _cli(capsys, [*args, "--timeout", f"{HANG_S:g}"])
    assert code == 3
    assert "cannot load their workload" in err and "RuntimeError: weights not found at /weights/model.bin" in err
    assert "Nothing was sent." in err and f"calque pool status --model {pool.model}" in err
    assert pool.queue.depth().visible == 0
    assert pool.store._keys(f"s3://{pool.bucket}/{pool.store.base}/runs/") == []


def test_a_waiting_submitter_stops_with_the_load_error_once_the_worker_fails(make_pool) -> None:
    pool = make_pool(workload=f"{FAILING_ENTER}::Broken", model="load/wait")
    record = pool.submit([1, 2, 3], method="go")  # no worker yet: nothing known, so the run is sent
    pool.start()
    with pytest.raises(PoolLoadError) as caught:  # not its timeout (a hang's): the worker's load error
        core.wait(pool.store, record, timeout_s=RUN_WAIT)
    assert "weights not found" in str(caught.value) and "claims stay queued" in str(caught.value)
    assert pool.queue.depth().visible == 1  # the claim is still there for a worker that loads


def test_repeated_load_failures_back_off_and_sigterm_ends_the_hold(make_pool) -> None:
    pool = make_pool(workload=f"{MISSING_IMPORT}::Broken", model="load/backoff")
    first = pool.start()
    assert first.proc.wait(timeout=PROC_WAIT) == 3
    assert "calque_nonexistent_pkg" in (_records(pool)[0].error or "")
    second = pool.start()  # what systemd's restart does: the same slot fails again
    wait_until(lambda: _records(pool)[0].failures == 2, PROC_WAIT, "the second failure's record")
    (rec,) = _records(pool)
    assert rec.retry_in_s == 10 and rec.worker_id.endswith(f":{second.proc.pid}")
    second.wait_log("holding 10s before exiting (backoff)")
    assert second.proc.poll() is None  # holding, not restarting at once
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(timeout=PROC_WAIT) == 3
    # systemctl stop does not wait out the backoff. A slot that failed six times in a row: the next
    # failure holds for the cap (300 s), past the ceiling of this wait, so only SIGTERM ends it in time.
    (uri,) = _record_uris(pool)
    now = datetime.now(timezone.utc)
    pool.store.put(uri, _records(pool)[0].model_copy(update={"failures": 6, "at": now}).model_dump_json().encode())
    third = pool.start()
    third.wait_log(f"holding {BACKOFF_MAX_S:g}s before exiting (backoff)")
    third.proc.send_signal(signal.SIGTERM)
    assert third.proc.wait(timeout=BACKOFF_MAX_S / 2) == 3


def test_a_serving_worker_names_its_methods_and_an_unknown_method_is_refused(make_pool, capsys, tmp_path) -> None:
    pool = make_pool(model="load/methods")
    w = pool.start()
    w.wait_log("serving")
    wait_until(lambda: _records(pool) and _records(pool)[0].state == "serving", PROC_WAIT, "a serving record")
    (rec,) = _records(pool)
    assert rec.methods == ["other", "work"] and rec.workload_digest and rec.enter_seconds is not None
    base = ["pool", "submit", "--model", pool.model, "--items", str(_items(tmp_path, 3)), "--bucket", pool.bucket]
    code, _, err = _cli(capsys, [*base, "--method", "wrok"])
    assert code == 2
    assert "it has no method 'wrok'" in err and "['other', 'work']" in err and "nothing was sent" in err
    assert pool.queue.depth().visible == 0
    code, out, err = _cli(capsys, [*base, "--method", "other", "--timeout", str(RUN_WAIT), "--json"])
    assert code == 0 and json.loads(out)["items_ok"] == 3, err
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(timeout=PROC_WAIT) == 0
    assert _records(pool)[0].state == "stopped"


def test_pool_status_lists_each_workers_load_and_the_load_error(make_pool, capsys) -> None:
    pool = make_pool(workload=f"{FAILING_ENTER}::Broken", model="load/status")
    assert pool.start().proc.wait(timeout=PROC_WAIT) == 3
    base = ["pool", "status", "--model", pool.model, "--bucket", pool.bucket]
    code, out, _ = _cli(capsys, [*base, "--json"])
    assert code == 0
    status = json.loads(out)
    assert status["queue_name"] == pool.queue.name and status["visible"] == 0
    assert [r["state"] for r in status["workers"]] == ["failed"]
    assert "weights not found" in status["load_error"]
    code, out, _ = _cli(capsys, base)
    assert code == 0
    assert "failed" in out and "RuntimeError: weights not found" in out and "load error: the pool's workers" in out


def test_several_workers_that_cannot_load_each_record_their_slot_and_the_parent_exits_3(make_pool) -> None:
    pool = make_pool(
        workload=f"{FAILING_ENTER}::Broken", model="load/several", workers=2, cuda_visible_devices=["0", "1"]
    )
    parent = pool.start()
    assert parent.proc.wait(timeout=PROC_WAIT) == 3, parent.stderr()
    records = _records(pool)
    assert sorted(r.slot[-2:] for r in records) == ["-0", "-1"]
    assert {r.state for r in records} == {"failed"} and all(r.worker_id.endswith(("/0", "/1")) for r in records)
    assert "see each worker's load record" in parent.stderr()
