"""Real worker processes against the session moto server: warm hits, crashes, signals, poison."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import defaultdict

import pytest
from calque.aws.clients import client
from calque.models import ClaimRef, Manifest, QueueSettings

from pool.conftest import PROC_WAIT, RUN_WAIT, Pool, WorkerProc, wait_until

pytestmark = pytest.mark.slow
SLOW = {"STEADY_DELAY_SCALE": "60"}  # 30 s per item: a worker is always mid-claim when stopped
FAST = {"STEADY_DELAY_SCALE": "0.1"}


def test_two_workers_thirty_claims_each_enter_once_and_every_result_once(make_pool) -> None:
    pool: Pool = make_pool(vt=60)  # no claim is redelivered (attempt 1 everywhere), however slow the box
    a, b = pool.start(), pool.start()
    record = pool.submit([{"args": [i], "kwargs": {"delay": 0.02}} for i in range(30)], batch_size=1)
    summaries = pool.wait_run(record)
    assert len(summaries) == 30
    results = pool.store.results(record)
    assert [r.index for r in results] == list(range(30))
    assert all(r.ok and r.value["x"] == r.index for r in results)
    by_worker: dict[str, list] = defaultdict(list)
    for s in summaries.values():
        assert s.ok and s.enter_count == 1 and s.attempt == 1
        by_worker[s.worker_id].append(s)
    for claims in by_worker.values():
        claims.sort(key=lambda s: s.started_at)
        assert [s.warm_hit for s in claims] == [False] + [True] * (len(claims) - 1)
        assert claims[0].enter_seconds_paid > 0 and all(s.enter_seconds_paid == 0 for s in claims[1:])
    pool.stop_all()
    for w in (a, b):
        assert w.proc.returncode == 0, w.stderr()
        assert "STEADY-EXIT" in w.stdout()  # @exit ran, and the script's stdout is kept
        assert "stderr from the script" in w.stderr()
        assert w.stdout().count("STEADY-EXIT") == 1


def test_kill_9_mid_claim_is_redelivered_and_completed_once(make_pool) -> None:
    # vt: short, since the test waits it out after the kill, but 8 s so that a heartbeat (every VT/3)
    # delayed by a loaded box does not let the claim be redelivered while a still holds it
    pool: Pool = make_pool(vt=8)
    a = pool.start()
    record = pool.submit([{"args": [i], "kwargs": {"delay": 0.5}} for i in range(4)], batch_size=4)
    a.wait_log("start 1", stream="stdout")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(timeout=PROC_WAIT)
    b = pool.start(env=FAST)
    (summary,) = pool.wait_run(record).values()
    assert summary.ok and summary.attempt == 2 and summary.worker_id.endswith(str(b.proc.pid))
    results = pool.store.results(record)
    assert [r.index for r in results] == [0, 1, 2, 3]


def _claim_release_test(pool: Pool, stop_a, **a_spec) -> WorkerProc:  # type: ignore[no-untyped-def]
    a = pool.start(env=SLOW, **a_spec)
    record = pool.submit([{"args": [i], "kwargs": {"delay": 0.5}} for i in range(6)], batch_size=6)
    a.wait_log("start 0", stream="stdout")
    b = pool.start(env=FAST)
    b.wait_log("serving")
    stop_a(a)
    # a stuck item (a 30 s sleep) cannot hold a stopping worker: it exits 0 within the bound (past
    # the bound its watchdog exits 1, so the wait itself can be generous)
    assert a.proc.wait(timeout=PROC_WAIT) == 0, a.stderr()
    assert "released message" in a.stderr()
    assert "STEADY-EXIT" in a.stdout()
    # the visibility timeout is 600 s (a extended it every 200 s): only an immediate release lets b
    # finish within this wait
    (summary,) = pool.wait_run(record, timeout=RUN_WAIT).values()
    # attempt 1: the release re-sent the claim, so it did not count as a delivery attempt
    assert summary.ok and summary.worker_id.endswith(str(b.proc.pid)) and summary.attempt == 1
    assert [r.index for r in pool.store.results(record)] == list(range(6))
    return a


def test_sigterm_mid_claim_releases_it_to_another_worker_at_once(make_pool) -> None:
    pool: Pool = make_pool(vt=600)
    _claim_release_test(pool, lambda a: a.proc.send_signal(signal.SIGTERM))


def test_spot_notice_over_imdsv2_releases_the_claim(make_pool, fake_imds) -> None:
    pool: Pool = make_pool(vt=600)

    def notice(_a: object) -> None:
        fake_imds.notice = True

    a = _claim_release_test(
        pool, notice, spot_watch=True, imds_endpoint=fake_imds.url, spot_poll_s=0.3
    )  # b has no spot watch: the notice is for a's instance only
    assert "spot interruption notice" in a.stderr()
    assert fake_imds.tokenless == 0 and fake_imds.token_puts >= 1 and fake_imds.authorised_gets >= 1


def test_poison_claims_fail_with_a_clear_summary_and_the_worker_keeps_serving(make_pool) -> None:
    pool: Pool = make_pool(max_manifest_bytes=1024)
    store = pool.store
    good = pool.submit([1, 2], batch_size=2)
    prefix = good.results_prefix
    sqs, url = client("sqs"), pool.queue.url()
    base = json.loads(ClaimRef(
        run_id=good.run_id, claim_id="x", model=pool.model, method="work", manifest_uri=prefix + "manifests/x.json",
        results_prefix=prefix, item_count=1, submitted_at=good.submitted_at,
    ).model_dump_json())  # fmt: skip

    def send(claim_id: str, **changes: object) -> None:
        body = {**base, "claim_id": claim_id, "manifest_uri": f"{prefix}manifests/{claim_id}.json", **changes}
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps(body))

    def stage(claim_id: str, body: bytes) -> None:
        store.put(f"{prefix}manifests/{claim_id}.json", body)

    def manifest(claim_id: str, method: str = "work", size: int = 1) -> bytes:
        m = Manifest(run_id=good.run_id, claim_id=claim_id, model=pool.model, method=method, items=[])
        m.items = [{"index": 100 + i, "args": ["x" * 10]} for i in range(size)]  # type: ignore[list-item]
        return m.model_dump_json().encode()

    send("missing")
    stage("invalid", b'{"version": 1, "run_id": 3}')
    send("invalid")
    stage("huge", manifest("huge", size=40))
    send("huge")
    stage("nomethod", manifest("nomethod", method="does_not_exist"))
    send("nomethod")
    stage("digest", manifest("digest"))
    send("digest", workload_digest="sha256:0000")
    stage("model", manifest("model"))
    send("model", model="org/another-model")
    send("broken", version="not-a-number")
    sqs.send_message(QueueUrl=url, MessageBody="this is not json")
    w = pool.start()
    want = {
        "missing": "does not exist",
        "invalid": "is invalid: run_id=3: Input should be a valid string; change run_id",
        "huge": "over the pool's limit of 1024",
        "nomethod": "method 'does_not_exist' does not exist on Steady",
        "digest": "claim wants workload sha256:0000",
        "model": "claim is for model 'org/another-model'",
        "broken": "unparseable ClaimRef",
    }

    def all_there() -> bool:
        return len(store.summaries(prefix)) >= len(want) + 1

    wait_until(all_there, RUN_WAIT, "every poison Summary and the good one")
    summaries = store.summaries(prefix)
    for claim_id, text in want.items():
        s = summaries[claim_id]
        assert not s.ok and s.error and text in s.error, (claim_id, s.error)
    assert summaries["c00000"].ok and [r.value["x"] for r in store.results(good)] == [1, 2]
    poison_keys = wait_until(
        lambda: client("s3").list_objects_v2(Bucket=pool.bucket, Prefix=store.base + "/poison/").get("Contents"),
        PROC_WAIT, "the poison record of the non-JSON message",
    )  # fmt: skip
    assert len(poison_keys) == 1
    wait_until(lambda: pool.queue.depth().visible + pool.queue.depth().in_flight == 0, PROC_WAIT, "an empty queue")
    after = pool.submit([3], batch_size=1)
    pool.wait_run(after)
    assert w.proc.poll() is None


def test_a_receive_that_ran_nothing_does_not_count_against_max_receive_count(make_pool) -> None:
    pool: Pool = make_pool(max_receive_count=1)  # one attempt may run: the receive below ran nothing
    record = pool.submit([1], batch_size=1)
    sqs, url = client("sqs"), pool.queue.url()
    msg = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"][0]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"], VisibilityTimeout=0)
    pool.start()
    (s,) = pool.wait_run(record).values()
    assert s.ok and s.attempt == 2, s.error  # before, "received 2 times, over the pool's max_receive_count 1"


def test_a_claim_whose_summary_exists_is_deleted_without_rerunning(make_pool) -> None:
    pool: Pool = make_pool()
    w = pool.start()
    record = pool.submit([1], batch_size=1)
    (first,) = pool.wait_run(record).values()
    # resend the same ClaimRef, as SQS does after a lost delete
    ref = ClaimRef(
        run_id=record.run_id, claim_id="c00000", model=pool.model, method="work",
        manifest_uri=record.results_prefix + "manifests/c00000.json", results_prefix=record.results_prefix,
        item_count=1, submitted_at=record.submitted_at,
    )  # fmt: skip
    pool.queue.send(ref)
    w.wait_log("already has a Summary")
    wait_until(
        lambda: pool.queue.depth().visible + pool.queue.depth().in_flight == 0, PROC_WAIT, "the duplicate deleted"
    )
    (again,) = pool.summaries(record).values()
    assert again == first
    assert w.stdout().count("start 1") == 1


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus exposition, parsed by prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, frozenset((k, v) for k, v in s.labels.items() if k not in ("model", "worker"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_on_a_port_count_claims_and_enters(make_pool) -> None:
    import socket
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pool: Pool = make_pool(metrics_port=port)
    w = pool.start()
    pool.wait_run(pool.submit([1, 2, 3], batch_size=1))
    w.wait_log("metrics on http://127.0.0.1:")

    def scrape() -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=PROC_WAIT).read().decode()

    ok = ("calque_pool_claims_total", frozenset({("outcome", "ok")}))
    text = wait_until(
        lambda: (t := scrape()) and _samples(t).get(ok) == 3 and t, PROC_WAIT, "three ok claims in the metrics"
    )
    samples = _samples(text)
    assert samples[("calque_pool_enter_count", frozenset())] == 1
    assert samples[("calque_pool_warm_hits_total", frozenset())] == 2
    # claim time is a histogram: three observations, every one under the +Inf bucket
    assert samples[("calque_pool_claim_seconds_count", frozenset())] == 3
    assert samples[("calque_pool_claim_seconds_bucket", frozenset({("le", "+Inf")}))] == 3
    assert samples[("calque_pool_claim_seconds_sum", frozenset())] > 0
    kinds = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert kinds["calque_pool_claims"] == "counter" and kinds["calque_pool_claim_seconds"] == "histogram"


def test_idle_timeout_runs_exit_and_stops_and_leaves_a_metrics_textfile(make_pool, tmp_path) -> None:
    prom = tmp_path / "calque-pool.prom"
    pool: Pool = make_pool(idle_timeout_s=1.0, metrics_textfile=str(prom))
    w = pool.start()
    assert w.proc.wait(timeout=PROC_WAIT) == 0
    assert "STEADY-EXIT" in w.stdout() and "stopping (idle)" in w.stderr()
    samples = _samples(prom.read_text())
    assert samples[("calque_pool_up", frozenset())] == 0
    assert samples[("calque_pool_enter_count", frozenset())] == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("calque-pool.prom")] == [prom.name]


def test_several_workers_per_host_get_one_device_each(make_pool, tmp_path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os, modal\napp = modal.App('p')\n@app.cls()\nclass P:\n"
        "    @modal.method()\n    def dev(self, x):\n        return os.environ.get('CUDA_VISIBLE_DEVICES')\n"
    )
    pool: Pool = make_pool(workload=probe, workers=2, cuda_visible_devices=["0", "1"])
    parent = pool.start()
    record = pool.submit([{"args": [i]} for i in range(20)], method="dev", batch_size=1)
    pool.wait_run(record)
    devices = {r.value for r in pool.store.results(record)}
    assert devices <= {"0", "1"}
    workers = {s.worker_id for s in pool.summaries(record).values()}
    assert all(w.endswith(("/0", "/1")) for w in workers)
    parent.proc.send_signal(signal.SIGTERM)
    assert parent.proc.wait(timeout=PROC_WAIT) == 0


def test_an_idle_worker_on_a_20s_long_poll_queue_stops_within_2s_of_sigterm(make_pool) -> None:
    pool: Pool = make_pool()
    pool.queue.ensure(QueueSettings(visibility_timeout=30, receive_wait=20, max_receive_count=10, encryption=False))
    w = pool.start(queue={"visibility_timeout": 30, "receive_wait": 20, "max_receive_count": 10})
    w.wait_log("serving")
    time.sleep(3.0)  # well into a poll: the queue would hold it 20 s
    sent = time.monotonic()
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(timeout=PROC_WAIT) == 0
    took = time.monotonic() - sent
    assert took < 2.0, f"stopped {took:.2f}s after SIGTERM"
    assert "stopping (sigterm)" in w.stderr() and "STEADY-EXIT" in w.stdout()  # @exit ran


def test_a_workers_2_parent_passes_its_override_flags_to_every_child(make_pool, fake_imds, tmp_path) -> None:
    from calque.pool.bootstrap import start_worker_process

    # the spec's IMDS is the real address (refused offline) and it has no idle timeout: only the flags,
    # if they reach the children, make each child watch the fake IMDS and idle out
    pool: Pool = make_pool(workers=2, spot_watch=True, spot_poll_s=0.3)
    spec = pool.write_spec()
    prom = tmp_path / "w.prom"
    flags = ["--imds-endpoint", fake_imds.url, "--idle-timeout", "3", "--metrics-textfile", str(prom)]
    err = tmp_path / "parent.err"
    parent = start_worker_process(spec, extra_args=flags, stdout=subprocess.DEVNULL, stderr=err.open("wb"))
    try:
        assert parent.wait(timeout=PROC_WAIT) == 0, err.read_text()
    finally:  # the parent forwards SIGTERM to its children
        if parent.poll() is None:
            parent.send_signal(signal.SIGTERM)
            parent.wait(timeout=PROC_WAIT)
    log = err.read_text()
    assert log.count("stopping (idle)") == 2  # each child idled out by --idle-timeout
    assert (tmp_path / "w-0.prom").is_file() and (tmp_path / "w-1.prom").is_file()  # --metrics-textfile, per child
    assert fake_imds.token_puts >= 2 and fake_imds.tokenless == 0  # each child's spot watch used --imds-endpoint

    # --instance-type reaches them too: an unknown one fails each child's load, and the parent exits 3
    bad = start_worker_process(spec, extra_args=["--instance-type", "no.such-type", "--idle-timeout", "3"],
                               stdout=subprocess.DEVNULL, stderr=err.open("wb"))  # fmt: skip
    try:
        assert bad.wait(timeout=PROC_WAIT) == 3
    finally:
        if bad.poll() is None:
            bad.send_signal(signal.SIGTERM)
            bad.wait(timeout=PROC_WAIT)
    assert err.read_text().count("no.such-type") >= 2
