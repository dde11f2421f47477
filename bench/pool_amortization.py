"""What a warm pool saves: calque's warm worker next to a cold process per claim and to Celery on SQS.

One run, one moto server on 127.0.0.1, figures side by side with their ratios (medians where a
figure is per claim). Nothing here is a test: it prints, it asserts nothing.

    .venv/bin/python bench/pool_amortization.py [--claims 20] [--items 10] [--enter 2.0] [--noop-items 500]
        [--rounds 3] [--skip-cold] [--noop-only]

(a) calque: one `calque pool worker` process; K claims of N items; `@enter` of --enter seconds and a
    method of 5 ms per item.
(b) cold baseline: a fresh process per claim (import + `@enter` + the claim), the shape of a
    task-per-process pool.
(c) raw boto3: the calls one claim needs (receive, get manifest, put results, put summary, delete),
    timed alone, next to calque's per-claim overhead beyond the method's own time.
(d) no-op items/s: calque (claims of 10 items) and Celery with its SQS broker (a warm solo worker
    holding the model in a module-level cache, one task per item), --rounds times, each run's end
    read from a local file every 10 ms (calque's metrics textfile, Celery's task log); medians.
    Needs the `bench` extra.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ENV = {
    "CALQUE_OFFLINE": "1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "PYTHONUNBUFFERED": "1",
}
BUCKET = "calque-bench"
METHOD_S = 0.005

WORKLOAD = """
import os, time
import modal

app = modal.App("bench")


@app.cls(gpu="A10G")
class Model:
    @modal.enter()
    def load(self):
        time.sleep(float(os.environ.get("BENCH_ENTER_S", "2.0")))
        self.weights = "loaded"

    @modal.method()
    def work(self, x):
        time.sleep(float(os.environ.get("BENCH_METHOD_S", "0.005")))
        return x

    @modal.method()
    def noop(self, x):
        return x
"""

COLD_CHILD = """
import sys
from datetime import datetime, timezone
from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.models import ClaimRef, Summary
from calque.pool.spec import load_spec
from calque.warm import WarmSupervisor

spec = load_spec(sys.argv[1])
pq = PoolQueue(client("sqs"), spec.model)
store = RunStore(client("s3"), spec.bucket, spec.prefix, pq.name)
msg = pq.receive(1, 1)[0]
ref = ClaimRef.model_validate_json(msg["Body"])
started = datetime.now(timezone.utc)
sup = WarmSupervisor.load(spec)
manifest = store.read_manifest(ref.manifest_uri, spec.max_manifest_bytes)
drain = sup.drain(manifest.method, manifest.items)
store.put_results(ref.results_prefix, ref.claim_id, drain.results)
now = datetime.now(timezone.utc)
store.put_summary(ref.results_prefix, Summary(
    run_id=ref.run_id, claim_id=ref.claim_id, model=ref.model, method=manifest.method, ok=True,
    items=len(manifest.items), failed=0, warm_hit=False, enter_seconds_paid=sup.enter_seconds, enter_count=1,
    attempt=1, worker_id="cold", started_at=started, finished_at=now,
    claim_seconds=(now - started).total_seconds(), method_seconds=drain.method_seconds))
pq.ack(msg["ReceiptHandle"])
sup.close()
"""

CELERY_APP = """
import os, time
from celery import Celery

app = Celery("bench_celery", broker=os.environ["BENCH_CELERY_BROKER"])
app.conf.broker_transport_options = {
    "region": "us-east-1", "is_secure": False, "polling_interval": 0, "wait_time_seconds": 1,
    "queue_name_prefix": "bench-celery-", "visibility_timeout": 60,
}
app.conf.worker_prefetch_multiplier = 10
app.conf.worker_hijack_root_logger = False
_MODEL = None  # the warm model, loaded once per worker process


def model():
    global _MODEL
    if _MODEL is None:
        _MODEL = "loaded"
    return _MODEL


@app.task(ignore_result=True)
def noop(x):
    model()
    with open(os.environ["BENCH_CELERY_OUT"], "a") as f:
        f.write(f"{time.time()}\\n")
"""


def _claims_ok(prom: Path) -> float:
    """The ok claims a worker's metrics textfile counts (0 before its first write)."""
    try:
        text = prom.read_text()
    except OSError:
        return 0.0
    found = re.search(r'^calque_pool_claims_total\{[^}]*outcome="ok"[^}]*\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(pred: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise SystemExit(f"benchmark: timed out after {timeout}s waiting for {what}")


def _ts(d: datetime) -> float:
    return d.timestamp()


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, endpoint: str) -> None:
        from calque.aws.clients import client
        from calque.aws.queue import PoolQueue
        from calque.models import QueueSettings

        self.args = args
        self.work = work
        self.endpoint = endpoint
        self.s3 = client("s3")
        self.sqs = client("sqs")
        self.s3.create_bucket(Bucket=BUCKET)
        self.script = work / "bench_model.py"
        self.script.write_text(WORKLOAD)
        self.env = {**os.environ, "BENCH_ENTER_S": str(args.enter), "BENCH_METHOD_S": str(METHOD_S)}
        self.queues: dict[str, Any] = {}
        for model in ("bench/warm", "bench/cold", "bench/raw", "bench/noop"):
            q = PoolQueue(self.sqs, model)
            q.ensure(QueueSettings(visibility_timeout=120, receive_wait=1, encryption=False))
            self.queues[model] = q

    def spec(self, model: str, **extra: Any) -> Path:
        import yaml

        doc = {
            "model": model,
            "workload": str(self.script),
            "bucket": BUCKET,
            "queue": {"visibility_timeout": 120, "receive_wait": 1},
            "spot_watch": False,
            **extra,
        }
        path = self.work / f"{model.replace('/', '-')}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    def submit(self, model: str, n_items: int, per_claim: int, method: str) -> Any:
        from calque.models import Item
        from calque.pool.submitter.submit import PoolTarget, submit

        items = [Item(index=i, args=[i]) for i in range(n_items)]
        return submit(PoolTarget(model, BUCKET), items, method=method, batch_size=per_claim)

    def store(self, model: str) -> Any:
        from calque.aws.store import RunStore

        return RunStore(self.s3, BUCKET, "calque", self.queues[model].name)

    # (a) ------------------------------------------------------------------------------------------

    def warm(self) -> dict[str, float]:
        a = self.args
        record = self.submit("bench/warm", a.claims * a.items, a.items, "work")
        store = self.store("bench/warm")
        from calque.pool.bootstrap import start_worker_process

        t0 = time.time()
        proc = start_worker_process(
            self.spec("bench/warm"), env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait(lambda: store.summary_count(record.results_prefix) >= a.claims, 120, "the warm run")
        t_end = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        ss = sorted(store.summaries(record.results_prefix).values(), key=lambda s: s.started_at)
        enter = ss[0].enter_seconds_paid
        enter_start = _ts(ss[0].started_at) - enter
        cycles = [_ts(b.started_at) - _ts(s.started_at) for s, b in itertools.pairwise(ss)]
        overheads = [c - s.method_seconds for c, s in zip(cycles, ss, strict=False)]
        gaps = [_ts(b.started_at) - _ts(s.finished_at) for s, b in itertools.pairwise(ss)]
        return {
            "total_incl_process_start": t_end - t0,
            "total_from_enter": t_end - enter_start,
            "enter": enter,
            "method_sum": sum(s.method_seconds for s in ss),
            "overhead_per_claim": statistics.median(overheads),
            "gap": statistics.median(gaps),
            "enter_count": max(s.enter_count for s in ss),
            "warm_hits": sum(1 for s in ss if s.warm_hit),
        }

    # (b) ------------------------------------------------------------------------------------------

    def cold(self) -> float:
        a = self.args
        self.submit("bench/cold", a.claims * a.items, a.items, "work")
        spec = self.spec("bench/cold")
        t0 = time.time()
        for _ in range(a.claims):
            subprocess.run([sys.executable, "-c", COLD_CHILD, str(spec)], env=self.env, check=True)
        return time.time() - t0

    # (c) ------------------------------------------------------------------------------------------

    def raw(self) -> float:
        """The boto3 calls one claim needs, alone: receive, get manifest, put results, put summary, delete."""
        a = self.args
        record = self.submit("bench/raw", a.claims * a.items, a.items, "work")
        url = self.queues["bench/raw"].url()
        prefix_key = record.results_prefix.split("/", 3)[3]
        results = "".join(json.dumps({"index": i, "ok": True, "value": i}) + "\n" for i in range(a.items))
        per: list[float] = []
        for _ in range(a.claims):
            t = time.perf_counter()
            msg = self.sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=1, MessageSystemAttributeNames=["All"]
            )["Messages"][0]
            ref = json.loads(msg["Body"])
            key = ref["manifest_uri"].split("/", 3)[3]
            self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
            self.s3.put_object(Bucket=BUCKET, Key=f"{prefix_key}results/{ref['claim_id']}.jsonl", Body=results)
            self.s3.put_object(Bucket=BUCKET, Key=f"{prefix_key}summaries/{ref['claim_id']}.json", Body=b"{}")
            self.sqs.delete_message(QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"])
            per.append(time.perf_counter() - t)
        return statistics.median(per)

    # (d) ------------------------------------------------------------------------------------------

    def noop_calque(self, round_no: int = 0) -> float:
        """Items/s from the first claim's start until the worker's textfile counts every claim done.

        The end is read from a local file every 10 ms, as Celery's is (``noop_celery``): a LIST of the
        summaries against the moto server under test, hosted in this process, would itself be load on
        it (one every 50 ms cost calque about a fifth of its figure). The worker writes its textfile
        after each claim's Summary PUT; its backlog sampler, which the textfile turns on, samples once.
        """
        n = self.args.noop_items
        record = self.submit("bench/noop", n, 10, "noop")
        store = self.store("bench/noop")
        from calque.pool.bootstrap import start_worker_process

        env = {**self.env, "BENCH_ENTER_S": "0"}
        prom = self.work / f"noop-{round_no}.prom"
        spec = self.spec("bench/noop", metrics_textfile=str(prom), backlog_poll_s=3600)
        proc = start_worker_process(spec, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(lambda: _claims_ok(prom) >= len(record.claims), 300, "the no-op run", interval=0.01)
        t_end = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        summaries = store.summaries(record.results_prefix)
        if len(summaries) != len(record.claims):
            raise SystemExit(f"benchmark: {len(summaries)} Summaries for {len(record.claims)} claims")
        first = min(_ts(s.started_at) for s in summaries.values())
        return n / (t_end - first)

    def noop_celery(self, round_no: int = 0) -> float | str:
        try:
            import celery  # noqa: F401
        except ImportError:
            return "celery not installed (pip install -e '.[bench]')"
        n = self.args.noop_items
        app_dir = self.work / f"celery_app-{round_no}"
        app_dir.mkdir()
        (app_dir / "bench_celery.py").write_text(CELERY_APP)
        out = self.work / f"celery-{round_no}.out"
        out.write_text("")
        host = self.endpoint.split("://", 1)[1]
        env = {**self.env, "BENCH_CELERY_BROKER": f"sqs://testing:testing@{host}", "BENCH_CELERY_OUT": str(out)}
        send = f"import bench_celery as b\nfor i in range({n}): b.noop.delay(i)\n"
        subprocess.run([sys.executable, "-c", send], cwd=app_dir, env=env, check=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench_celery", "worker", "--pool=solo", "-l", "error"],
            cwd=app_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait(lambda: len(out.read_text().splitlines()) >= n, 300, "the Celery run", interval=0.01)
        t_end = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        first = min(float(x) for x in out.read_text().split())
        return n / (t_end - first)


def _per_s(figure: float | str) -> str:
    return f"{figure:.0f}/s" if isinstance(figure, float) else figure


def _row(name: str, calque: str, other: str, ratio: str, target: str) -> str:
    return f"{name:<44} {calque:>14} {other:>16} {ratio:>9}  {target}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--claims", type=int, default=20)
    p.add_argument("--items", type=int, default=10)
    p.add_argument("--enter", type=float, default=2.0)
    p.add_argument("--noop-items", type=int, default=500)
    p.add_argument("--skip-cold", action="store_true")
    p.add_argument("--noop-only", action="store_true", help="only (d), the no-op items/s beside Celery's")
    p.add_argument("--rounds", type=int, default=3, help="(d)'s rounds, calque then Celery in each; medians")
    args = p.parse_args()

    os.environ.update(ENV)
    for k in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        os.environ.pop(k, None)
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    work = Path(tempfile.mkdtemp(prefix="calque-bench-"))
    try:
        b = Bench(args, work, endpoint)
        print(f"calque pool amortization, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, moto {endpoint}", flush=True)
        shape = f"K={args.claims} claims x {args.items} items, @enter {args.enter}s"
        print(f"{shape}, method {METHOD_S * 1000:.0f} ms/item")
        if not args.noop_only:
            w = b.warm()
            print(f"  (a) warm worker done: enter count {w['enter_count']:.0f}, warm hits {w['warm_hits']:.0f}")
            cold = None if args.skip_cold else b.cold()
            raw = b.raw()
        noop_cs: list[float] = []
        noop_ps: list[float | str] = []
        for r in range(args.rounds):
            noop_cs.append(b.noop_calque(r))
            noop_ps.append(b.noop_celery(r))
            print(f"  (d) round {r + 1}: calque {noop_cs[-1]:.0f}/s, celery {_per_s(noop_ps[-1])}", flush=True)
        noop_c = statistics.median(noop_cs)
        peers = [p for p in noop_ps if isinstance(p, float)]
        noop_p: float | str = statistics.median(peers) if peers else noop_ps[0]
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    print()
    print(_row("figure", "calque", "baseline/peer", "ratio", "target"))
    print("-" * 110)
    if not args.noop_only:
        _print_amortization(args, w, cold, raw)
    if isinstance(noop_p, float):
        ratios = sorted(c / p for c, p in zip(noop_cs, noop_ps, strict=True) if isinstance(p, float))
        print(_row(f"no-op items/s ({args.noop_items} items, median of {args.rounds})", f"{noop_c:.0f}/s",
                   f"celery {noop_p:.0f}/s", f"{noop_c / noop_p:.1f}x", ">= 8x (calque/celery)"))  # fmt: skip
        print(f"  per-round ratios: {', '.join(f'{r:.1f}x' for r in ratios)}")
    else:
        print(_row(f"no-op items/s ({args.noop_items} items)", f"{noop_c:.0f}/s", "-", "-", noop_p))
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")


def _print_amortization(args: argparse.Namespace, w: dict[str, float], cold: float | None, raw: float) -> None:
    floor = args.enter + args.claims * args.items * METHOD_S
    warm_total = w["total_incl_process_start"]
    if cold is not None:
        print(_row("total wall, K claims (incl. process start)", f"{warm_total:.2f}s", f"cold {cold:.2f}s",
                   f"{cold / warm_total:.1f}x", ">= 10x (cold/calque)"))  # fmt: skip
    over = w["overhead_per_claim"]
    print(_row("per-claim overhead beyond the method (median)", f"{over * 1000:.1f}ms",
               f"raw boto3 {raw * 1000:.1f}ms", f"{over / raw:.2f}x", "<= 1.5x (calque/raw)"))  # fmt: skip
    print(_row("gap between consecutive claims (median)", f"{w['gap'] * 1000:.2f}ms", "-", "-", "< 10 ms"))
    print(_row("total from @enter start vs the floor", f"{w['total_from_enter']:.2f}s",
               f"floor {floor:.2f}s", f"{w['total_from_enter'] / floor:.2f}x", "<= 1.2x (calque/floor)"))  # fmt: skip
    print()
    print(
        textwrap.dedent(f"""\
        notes: enter paid once ({w["enter"]:.2f}s); methods' own time {w["method_sum"]:.2f}s; the calque total
        with process start includes Python importing calque and boto3 once. Per-claim figures are medians over
        {args.claims - 1} consecutive claims on one worker (Summary timestamps).""")
    )


if __name__ == "__main__":
    main()
