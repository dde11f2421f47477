"""What `calque run` costs over `calque pool submit`: `.map` and `.remote` per item vs the submit floor.

One moto server process on 127.0.0.1 and one real worker process serving a no-op method; figures side
by side with their ratios. Nothing here is a test: it prints, it asserts nothing.

    .venv/bin/python bench/run_overhead.py [--items 2000] [--remote-items 100]

(a) floor: `calque pool submit`'s core (stage the items in claims of the pool's batch size, wait for
    every Summary), time to the first Summary and items/s;
(b) `.map` over the same items from a local entrypoint run by `calque run --pool SPEC`: time to the
    first value in the entrypoint, items/s to the last value (target: within 1.3x of (a));
(c) `.remote` once per item, one after another (--remote-items of them): items/s and first value.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stage_throughput import ENV, _start_moto

BUCKET = "calque-bench-run"
MODEL = "bench/run-noop"
SCRIPT = """
import json, os, time
import modal

app = modal.App("bench-run")


@app.cls()
class Noop:
    @modal.enter()
    def load(self):
        self.ready = True

    @modal.method()
    def noop(self, x):
        return x


def _timed(values, n):
    t0 = time.monotonic()
    first = None
    count = 0
    for _ in values:
        count += 1
        if first is None:
            first = time.monotonic() - t0
    total = time.monotonic() - t0
    with open(os.environ["BENCH_OUT"], "w") as f:
        json.dump({"first": first, "total": total, "count": count}, f)


@app.local_entrypoint()
def map_all(n: int = 2000):
    _timed(Noop().noop.map(range(n)), n)


@app.local_entrypoint()
def remote_each(n: int = 100):
    model = Noop()
    _timed((model.noop.remote(i) for i in range(n)), n)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=2000)
    p.add_argument("--remote-items", type=int, default=100)
    args = p.parse_args()
    os.environ.update(ENV)
    for k in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        os.environ.pop(k, None)
    moto, url = _start_moto()
    os.environ["AWS_ENDPOINT_URL"] = url
    work = Path(tempfile.mkdtemp(prefix="calque-bench-run-"))
    worker = None
    try:
        import yaml
        from calque.aws.clients import client
        from calque.aws.queue import PoolQueue
        from calque.models import Item, QueueSettings
        from calque.pool.bootstrap import start_worker_process
        from calque.pool.submitter import submit as core
        from calque.run.script import run_script

        client("s3").create_bucket(Bucket=BUCKET)
        PoolQueue(client("sqs"), MODEL).ensure(QueueSettings(receive_wait=1, encryption=False))
        script = work / "bench_run.py"
        script.write_text(SCRIPT)
        spec = work / "spec.yml"
        doc = {"model": MODEL, "workload": f"{script}::Noop", "bucket": BUCKET, "queue": {"receive_wait": 1},
               "spot_watch": False, "batch_size": 10}  # fmt: skip
        spec.write_text(yaml.safe_dump(doc))
        log = (work / "worker.err").open("wb")
        worker = start_worker_process(spec, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stderr=log)
        deadline = time.monotonic() + 120
        while "serving" not in (work / "worker.err").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        target = core.PoolTarget(MODEL, BUCKET)
        # (a) the floor: pool submit's stage + wait
        items = [Item(index=i, args=[i]) for i in range(args.items)]
        t0 = time.monotonic()
        started = datetime.now(timezone.utc)
        record = core.submit(target, items, method="noop", batch_size=10)
        store = target.store(record.queue_name)
        rep = core.wait(store, record, timeout_s=600)
        floor_total = time.monotonic() - t0
        first_summary = min(s.finished_at for s in store.summaries(record.results_prefix).values())
        floor_first = (first_summary - started).total_seconds()
        out = work / "out.json"
        os.environ["BENCH_OUT"] = str(out)
        # (b) .map through calque run
        run_script(f"{script}::map_all", ["--n", str(args.items)], pool=str(spec), timeout_s=600)
        m = json.loads(out.read_text())
        # (c) .remote per item
        run_script(f"{script}::remote_each", ["--n", str(args.remote_items)], pool=str(spec), timeout_s=600)
        r = json.loads(out.read_text())
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=60)
        moto.terminate()
        moto.wait()
    floor_rate = args.items / floor_total
    map_rate = m["count"] / m["total"]
    remote_rate = r["count"] / r["total"]
    print(f"calque run overhead, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, moto_server {url}, "
          f"{os.cpu_count()} CPUs, 1 worker, no-op method, batch size 10")  # fmt: skip
    print(f"{'path':38} {'items':>6} {'items/s':>9} {'first result s':>15} {'vs submit':>10}")
    print("-" * 82)
    print(f"{'(a) calque pool submit (floor)':38} {args.items:6d} {floor_rate:9.1f} {floor_first:15.2f} {'1.00x':>10}")
    print(f"{'(b) calque run: .map':38} {m['count']:6d} {map_rate:9.1f} {m['first']:15.2f} "
          f"{floor_rate / map_rate:9.2f}x")  # fmt: skip
    print(f"{'(c) calque run: .remote per item':38} {r['count']:6d} {remote_rate:9.1f} {r['first']:15.2f} "
          f"{floor_rate / remote_rate:9.2f}x")  # fmt: skip
    print(f"ratio = submit items/s over this path's (time per item relative to the floor); target (b) <= 1.3x; "
          f"run {rep.run_id}: {rep.items_ok} ok")  # fmt: skip


if __name__ == "__main__":
    main()
