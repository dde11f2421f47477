"""`calque pool status|submit` as a user sees them, and the cost model."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import datetime, timezone

import pytest
from calque.aws.clients import client
from calque.cli.main import run
from calque.errors import UsageError
from calque.pool.cost import claim_cost, run_cost

from pool.conftest import RUN_WAIT, Pool


def _cloudwatch_says_the_oldest_message_is_42s_old(pool: Pool) -> None:
    """The datapoint SQS publishes to CloudWatch (moto publishes none of its own)."""
    client("cloudwatch").put_metric_data(
        Namespace="AWS/SQS",
        MetricData=[{
            "MetricName": "ApproximateAgeOfOldestMessage", "Value": 42.0, "Timestamp": datetime.now(timezone.utc),
            "Dimensions": [{"Name": "QueueName", "Value": pool.queue.name}],
        }],
    )  # fmt: skip


def test_status_shows_depth_and_the_oldest_message_age(make_pool, capsys) -> None:
    pool: Pool = make_pool()
    pool.submit([1, 2, 3], batch_size=1)
    _cloudwatch_says_the_oldest_message_is_42s_old(pool)
    capsys.readouterr()
    assert run(["pool", "status", "--model", pool.model, "--json"]) == 0
    depth = json.loads(capsys.readouterr().out)
    assert depth["queue_name"] == pool.queue.name and depth["visible"] == 3 and depth["dlq_visible"] == 0
    assert depth["oldest_message_age_s"] == 42
    assert run(["pool", "status", "--model", pool.model]) == 0
    human = capsys.readouterr().out
    assert pool.queue.name in human and "42s" in human


def test_an_empty_queue_has_no_oldest_message_whatever_cloudwatch_last_said(make_pool, capsys) -> None:
    """CloudWatch's age lags the queue by minutes: once the queue is empty, status shows no age."""
    pool: Pool = make_pool()
    _cloudwatch_says_the_oldest_message_is_42s_old(pool)
    capsys.readouterr()
    assert run(["pool", "status", "--model", pool.model, "--json"]) == 0
    depth = json.loads(capsys.readouterr().out)
    assert depth["visible"] == depth["in_flight"] == depth["delayed"] == 0
    assert depth["oldest_message_age_s"] is None


def test_status_of_a_missing_pool_names_the_queue(moto, capsys) -> None:
    assert run(["pool", "status", "--model", "no/such-model"]) == 3
    assert "looked for SQS queue 'calque-pool-no-such-model-" in capsys.readouterr().err


@pytest.mark.slow
def test_submit_prints_warm_hits_enter_paid_and_the_cost_line(make_pool, capsys, tmp_path) -> None:
    pool: Pool = make_pool(instance_type="g5.xlarge")
    pool.start()
    items = tmp_path / "items.jsonl"
    items.write_text("".join(f"{i}\n" for i in range(6)))
    capsys.readouterr()
    args = ["pool", "submit", "--model", pool.model, "--items", str(items), "--method", "work", "--batch-size", "2"]
    assert run([*args, "--bucket", pool.bucket, "--timeout", str(RUN_WAIT)]) == 0
    out = capsys.readouterr().out
    assert "items: 6 ok, 0 failed of 6" in out and "claims: 3/3 done" in out
    assert "warm hits: 2/3" in out
    assert "cost: fixed $" in out and "at g5.xlarge $1.006/h" in out
    summaries = list(pool.store.summaries(pool.store.run_prefix(out.split()[1])).values())
    paid = [s for s in summaries if s.cost and s.cost.fixed_usd > 0]
    assert len(paid) == 1 and paid[0].enter_seconds_paid > 0 and not paid[0].warm_hit


def test_claim_cost_charges_enter_only_when_paid() -> None:
    cold = claim_cost("g5.xlarge", enter_seconds_paid=3600.0, serve_seconds=1800.0, items=10)
    assert cold.fixed_usd == pytest.approx(1.006) and cold.variable_usd == pytest.approx(0.503)
    assert cold.per_item_usd == pytest.approx(0.1509)
    warm = claim_cost("g5.xlarge", enter_seconds_paid=0.0, serve_seconds=1800.0, items=10)
    assert warm.fixed_usd == 0 and warm.total_usd == pytest.approx(0.503)
    with pytest.raises(UsageError):
        claim_cost("no.such-type", 1.0, 1.0, 1)


def test_run_cost_sums_its_claims() -> None:
    from calque.models import Summary

    now = datetime.now(timezone.utc)

    def s(enter: float, serve: float) -> Summary:
        return Summary(
            run_id="r", claim_id=f"c{enter}{serve}", model="m", method="f", ok=True, items=10, failed=0,
            warm_hit=enter == 0, enter_seconds_paid=enter, enter_count=1, attempt=1, worker_id="w", started_at=now,
            finished_at=now, claim_seconds=serve, method_seconds=serve,
            cost=claim_cost("g5.xlarge", enter, serve, 10),
        )  # fmt: skip

    total = run_cost([s(3600.0, 0.0), s(0.0, 3600.0)])
    assert total is not None
    assert total.fixed_usd == pytest.approx(1.006) and total.variable_usd == pytest.approx(1.006)
    assert total.per_item_usd == pytest.approx(2.012 / 20)


@pytest.mark.slow
def test_submit_with_spec_takes_model_pool_and_bucket_from_the_spec_file(make_pool, capsys, tmp_path) -> None:
    from calque.aws.queue import PoolQueue
    from calque.models import QueueSettings

    pool: Pool = make_pool(pool="lab-a/steady")  # a named pool: its queue derives from the name, not the model
    named = PoolQueue(client("sqs"), pool.model, pool="lab-a/steady")
    named.ensure(QueueSettings(visibility_timeout=30, receive_wait=1, max_receive_count=10, encryption=False))
    pool.start()
    spec = pool.write_spec()
    items = tmp_path / "items.jsonl"
    items.write_text("".join(f"{i}\n" for i in range(4)))
    capsys.readouterr()
    args = ["pool", "submit", "--spec", str(spec), "--items", str(items), "--method", "work", "--json"]
    assert run([*args, "--timeout", str(RUN_WAIT)]) == 0  # no --model, --pool or --bucket
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == pool.model and report["queue_name"] == named.name
    assert report["items_ok"] == 4 and report["items_failed"] == 0
    # the run's results, found again through the same spec file
    assert run(["pool", "results", report["run_id"], "--spec", str(spec)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4


def test_submit_without_spec_or_model_says_what_to_give(moto, capsys, tmp_path) -> None:
    items = tmp_path / "items.jsonl"
    items.write_text("1\n")
    assert run(["pool", "submit", "--items", str(items), "--bucket", "b"]) == 2
    assert "pass --spec FILE (the spec file pool.yml writes) or --model" in capsys.readouterr().err


@pytest.mark.slow
def test_status_counts_two_workers_running_side_by_side_on_one_host(make_pool, capsys) -> None:
    from pool.conftest import PROC_WAIT, wait_until

    pool: Pool = make_pool()
    first, second = pool.start(), pool.start()  # two `calque pool worker --spec` on this host, no --index
    for w in (first, second):
        w.wait_log("serving")

    def serving() -> list[dict[str, str]]:
        capsys.readouterr()
        assert run(["pool", "status", "--model", pool.model, "--bucket", pool.bucket, "--json"]) == 0
        return [r for r in json.loads(capsys.readouterr().out)["workers"] if r["state"] == "serving"]

    both = wait_until(lambda: len(serving()) == 2 and serving(), PROC_WAIT, "two serving load records")
    assert len({r["slot"] for r in both}) == 2 and len({r["worker_id"] for r in both}) == 2
    # a restarted worker takes its slot again: still two records, not three
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(timeout=PROC_WAIT) == 0
    third = pool.start()
    third.wait_log("serving")

    def records() -> list[dict[str, str]]:
        capsys.readouterr()
        assert run(["pool", "status", "--model", pool.model, "--bucket", pool.bucket, "--json"]) == 0
        found: list[dict[str, str]] = json.loads(capsys.readouterr().out)["workers"]
        return found

    # The log line can come before the record's write lands over the stopped worker's: wait for the record.
    now = wait_until(lambda: (r := records()) and {x["state"] for x in r} == {"serving"} and r, PROC_WAIT,
                     "the restarted worker's record serving in its slot")  # fmt: skip
    assert sorted(r["slot"] for r in now) == sorted(r["slot"] for r in both)


def test_status_reads_the_workers_records_without_pydantic_and_prints_what_json_says(make_pool, capsys) -> None:
    """The human output is read into pydantic-free views (start-up: bench/pool_status.py); a fresh process
    shows every record and the load error, imports no pydantic, and agrees with ``--json``."""
    from calque.models import LoadRecord
    from calque.models.pool_loads import slot_uri

    pool: Pool = make_pool()
    now = datetime.now(timezone.utc)
    records = [
        LoadRecord(slot="gpu-a/0", worker_id="gpu-a:41/0", state="failed", workload="w.py::M", failures=2,
                   error="RuntimeError: weights not found", at=now, seen_at=now),
        LoadRecord(slot="gpu-b/0", worker_id="gpu-b:7/0", state="stopped", workload="w.py::M", at=now, seen_at=now),
    ]  # fmt: skip
    for r in records:
        pool.store.put(slot_uri(pool.store, r.slot), r.model_dump_json().encode())
    pool.store.put(slot_uri(pool.store, "gpu-c/0"), b'{"version": 9, "slot": "gpu-c/0"}')  # a newer calque's
    args = ["pool", "status", "--model", pool.model, "--bucket", pool.bucket]
    code = (
        "import sys\nfrom calque.cli.main import run\n"
        f"rc = run({args!r})\n"
        "print('pydantic:', sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')), rc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.rstrip().endswith("pydantic: [] 0"), done.stdout + done.stderr
    human = done.stdout
    assert "gpu-a/0" in human and "RuntimeError: weights not found (2 in a row)" in human
    assert "gpu-b/0" in human and "stopped" in human and "gpu-c/0" not in human
    assert "load error: the pool's workers cannot load their workload w.py::M" in human
    capsys.readouterr()
    assert run([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [w["slot"] for w in doc["workers"]] == ["gpu-a/0", "gpu-b/0"]
    said, _, since = doc["load_error"].splitlines()[0].partition(" failed ")  # "... failed 1s ago (2 times ..."
    assert f"{said} failed " in human and since.split(" ago ", 1)[1] in human  # the same words, a second apart
