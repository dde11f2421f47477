"""How fast `calque pool submit` stages a run: concurrent manifests and SendMessageBatch vs one at a time.

One moto server process on 127.0.0.1; figures side by side with their ratio. Nothing is asserted.

    .venv/bin/python bench/stage_throughput.py [--items 50000] [--batch-size 10] [--baseline-items 2000]
                                                [--moto linear|stock]

(a) calque: ``calque.pool.submitter.submit.submit`` (manifests PUT on a bounded thread pool, ClaimRefs sent ten
    to a SendMessageBatch as their manifests land), --items items at --batch-size.
(b) baseline: the previous staging, one manifest PUT then one SendMessage per claim, in a row, on
    --baseline-items items (default: as many; 50,000 items took 729 s this way), as items/s.
Target: 50,000 items at the default batch size of 10 staged in under 60 s.

moto's SendMessage recomputes the queue's attributes, walking every message in the queue, on each
send (moto/sqs/models.py ``Queue.attributes``), so against stock moto staging N claims costs O(N^2)
whatever the client does. By default the server is ``bench/moto_linear.py``: moto with that one
defect taken out (a send no longer counts the queue), so the figure is the client's; ``--moto stock``
runs plain ``moto_server`` (then compare the two paths on equal item counts, equal queue depths).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

ENV = {
    "CALQUE_OFFLINE": "1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
BUCKET = "calque-bench-stage"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_moto(kind: str = "stock") -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    if kind == "stock":
        cmd = [str(Path(sys.executable).with_name("moto_server"))]
    else:
        cmd = [sys.executable, str(Path(__file__).with_name("moto_linear.py"))]
    proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("benchmark: moto_server did not start")


def _baseline(target: object, items: list[object], batch_size: int) -> float:
    """The staging this replaces: a manifest PUT and a SendMessage per claim, one after another."""
    from calque.models import ClaimRef, Manifest
    from calque.pool.submitter.submit import PoolTarget, new_run_id

    assert isinstance(target, PoolTarget)
    pq = target.queue()
    store = target.store(pq.name)
    run_id = new_run_id()
    prefix = store.run_prefix(run_id)
    now = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    for n, i in enumerate(range(0, len(items), batch_size)):
        chunk = items[i : i + batch_size]
        m = Manifest(run_id=run_id, claim_id=f"c{n:05d}", model=target.model, method="noop", items=chunk)  # type: ignore[arg-type]
        uri = store.put_manifest(prefix, m)
        pq.send(ClaimRef(run_id=run_id, claim_id=m.claim_id, model=target.model, method="noop", manifest_uri=uri,
                         results_prefix=prefix, item_count=len(chunk), submitted_at=now))  # fmt: skip
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=50_000)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--baseline-items", type=int, default=None)
    p.add_argument("--moto", choices=("linear", "stock"), default="linear", help="the server (see above)")
    args = p.parse_args()
    os.environ.update(ENV)
    for k in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        os.environ.pop(k, None)
    moto, url = _start_moto(args.moto)
    os.environ["AWS_ENDPOINT_URL"] = url
    try:
        from calque.aws.clients import client
        from calque.aws.queue import PoolQueue
        from calque.models import Item, QueueSettings
        from calque.pool.submitter.submit import PoolTarget, submit

        client("s3").create_bucket(Bucket=BUCKET)
        for model in ("bench/stage", "bench/stage-baseline"):
            PoolQueue(client("sqs"), model).ensure(QueueSettings(encryption=False))
        items = [Item(index=i, args=[f"text {i}"]) for i in range(args.items)]
        target = PoolTarget("bench/stage", BUCKET)
        t0 = time.perf_counter()
        record = submit(target, items, method="noop", batch_size=args.batch_size)
        ours = time.perf_counter() - t0
        base_items = items[: args.baseline_items or args.items]
        base = _baseline(PoolTarget("bench/stage-baseline", BUCKET), base_items, args.batch_size)  # type: ignore[arg-type]
    finally:
        moto.terminate()
        moto.wait()
    ours_rate = args.items / ours
    base_rate = len(base_items) / base
    server = "bench/moto_linear.py (moto, a send not counting the queue)" if args.moto == "linear" else "moto_server"
    print(f"staging, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {server} at {url}, {os.cpu_count()} CPUs")
    print(f"{'figure':44} {'calque':>14} {'baseline':>14} {'ratio':>8}")
    print("-" * 84)
    print(f"{'items/s staged (batch size ' + str(args.batch_size) + ')':44} {ours_rate:14.0f} {base_rate:14.0f} "
          f"{ours_rate / base_rate:7.1f}x")  # fmt: skip
    print(f"{f'{args.items:,} items, {len(record.claims):,} claims: seconds':44} {ours:14.1f} "
          f"{args.items / base_rate:13.1f}* {args.items / base_rate / ours:7.1f}x")  # fmt: skip
    note = "" if len(base_items) == args.items else f" (extrapolated from {len(base_items):,} items: a shallower queue)"
    print(f"* baseline{note}; target: under 60 s for 50,000 items")


if __name__ == "__main__":
    main()
