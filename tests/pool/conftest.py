"""Pool fixtures: a queue and bucket on the session moto server, a spec file, real worker processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.models import QueueSettings, RunRecord, Summary
from calque.pool.bootstrap import start_worker_process
from calque.pool.submitter import submit as core
from support.waits import HANG_S, until

HERE = Path(__file__).resolve().parent
STEADY = HERE / "workloads" / "steady.py"
# Bounds for waits on real worker processes. CI runs the suite on a loaded 2-core box, where a worker's
# start-up (imports, @enter) alone can take many seconds: every wait ends as soon as its condition
# holds, and only a hang (support/waits.py's HANG_S) reaches the bound.
PROC_WAIT = HANG_S
RUN_WAIT = HANG_S


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """``pred()``'s first truthy answer, polled every ``interval`` s; past ``timeout`` (a hang) an AssertionError."""
    return until(pred, f"waiting for {what}", ceiling=timeout, every=interval)


@dataclass
class WorkerProc:
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    @property
    def worker_id(self) -> str:
        """What the worker calls itself: this process's pid (its witness's), which an operator kills."""
        return f"{socket.gethostname()}:{self.proc.pid}"

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = PROC_WAIT, stream: str = "stderr") -> None:
        read = self.stderr if stream == "stderr" else self.stdout

        def seen() -> bool:
            if self.proc.poll() is not None and text not in read():
                raise AssertionError(f"worker exited ({self.proc.returncode}) before '{text}':\n{self.stderr()}")
            return text in read()

        wait_until(seen, timeout, f"'{text}' in the worker's {stream}")


@dataclass
class Pool:
    tmp: Path
    model: str
    bucket: str
    spec: dict[str, Any]
    queue: PoolQueue
    workers: list[WorkerProc] = field(default_factory=list)

    @property
    def target(self) -> core.PoolTarget:
        return core.PoolTarget(self.model, self.bucket, "calque")

    @property
    def store(self) -> RunStore:
        return RunStore(client("s3"), self.bucket, "calque", self.queue.name)

    def write_spec(self, **changes: Any) -> Path:
        doc = {**self.spec, **changes}
        path = self.tmp / f"spec-{len(self.workers)}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    def start(self, env: dict[str, str] | None = None, **spec_changes: Any) -> WorkerProc:
        n = len(self.workers)
        path = self.write_spec(**spec_changes)
        out, err = self.tmp / f"worker-{n}.out", self.tmp / f"worker-{n}.err"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        proc = start_worker_process(path, env=full_env, stdout=out.open("wb"), stderr=err.open("wb"))
        w = WorkerProc(proc, out, err)
        self.workers.append(w)
        return w

    def submit(self, lines: list[Any], method: str | None = "work", batch_size: int = 10) -> RunRecord:
        items = self.tmp / f"items-{time.monotonic_ns()}.jsonl"
        items.write_text("".join(json.dumps(x) + "\n" for x in lines))
        return core.submit(self.target, core.read_items(items), method=method, batch_size=batch_size)

    def summaries(self, record: RunRecord) -> dict[str, Summary]:
        return self.store.summaries(record.results_prefix)

    def wait_run(self, record: RunRecord, timeout: float = RUN_WAIT) -> dict[str, Summary]:
        wait_until(
            lambda: self.store.summary_count(record.results_prefix) >= len(record.claims), timeout, "every Summary"
        )
        return self.summaries(record)

    def stop_all(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.proc.wait(timeout=PROC_WAIT)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()


@pytest.fixture
def make_pool(moto: str, tmp_path: Path) -> Iterator[Callable[..., Pool]]:
    pools: list[Pool] = []

    # vt: long enough that a loaded box never misses a heartbeat (VT/3) by a whole VT, which would
    # redeliver a claim its worker still holds; tests of redelivery pick their own.
    def make(workload: str | Path = STEADY, model: str = "org/steady", vt: int = 30, **spec: Any) -> Pool:
        bucket = "calque-test-bucket"
        s3 = client("s3")
        if bucket not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
            s3.create_bucket(Bucket=bucket)
        q = PoolQueue(client("sqs"), model)
        q.ensure(QueueSettings(visibility_timeout=vt, receive_wait=1, max_receive_count=10, encryption=False))
        doc: dict[str, Any] = {
            "model": model,
            "workload": str(workload),
            "bucket": bucket,
            "queue": {"visibility_timeout": vt, "receive_wait": 1, "max_receive_count": 10},
            "spot_watch": False,
            "shutdown_grace_s": 10,
            **spec,
        }
        p = Pool(tmp_path / f"pool-{len(pools)}", model, bucket, doc, q)
        p.tmp.mkdir()
        pools.append(p)
        return p

    yield make
    for p in pools:  # signal every worker first, then wait: they stop in parallel
        for w in p.workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
    for p in pools:
        p.stop_all()


class FakeImds:
    """An IMDSv2 on 127.0.0.1: tokens by PUT, token-less GETs refused (401), a spot notice on demand."""

    TOKEN = "calque-test-token"

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.notice = False
        self.tokenless = 0
        self.token_puts = 0
        self.authorised_gets = 0
        self.paths: dict[str, str] = {}  # more metadata by path under /latest/meta-data/ (instance-id, ...)
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    imds.token_puts += 1
                    self._reply(200, FakeImds.TOKEN)
                else:
                    self._reply(400)

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") != FakeImds.TOKEN:
                    imds.tokenless += 1
                    self._reply(401)
                    return
                imds.authorised_gets += 1
                if self.path == "/latest/meta-data/spot/instance-action" and imds.notice:
                    self._reply(200, json.dumps({"action": "terminate", "time": "2026-01-01T00:02:00Z"}))
                elif self.path.removeprefix("/latest/meta-data/") in imds.paths:
                    self._reply(200, imds.paths[self.path.removeprefix("/latest/meta-data/")])
                else:
                    self._reply(404)

            def log_message(self, *_: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_imds() -> Iterator[FakeImds]:
    imds = FakeImds()
    yield imds
    imds.close()
