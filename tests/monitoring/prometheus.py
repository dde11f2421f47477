"""A real Prometheus server on 127.0.0.1 for a test: a free port, its own storage directory, the
shipped rules, 1 s scrapes and evaluations of the targets it is given; queried through its HTTP API."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from support.waits import HANG_S, until

from .promql import RULES

PROMETHEUS = shutil.which("prometheus")
READY_WAIT_S = HANG_S  # the server ready: however loaded the machine, only a hang fails


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Prometheus:
    url: str
    log: Path

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as exc:  # a bad query: Prometheus says why in the body
            doc = json.loads(exc.read())
        return doc

    def query(self, expr: str) -> list[dict[str, Any]]:
        doc = self.api("query", query=expr)
        assert doc["status"] == "success", f"{expr}: {doc.get('error')}"
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def wait(self, expr: str, what: str) -> list[dict[str, Any]]:
        """The query's result once it is not empty (polled every 0.5 s; only a hang, ``HANG_S``, fails)."""
        return until(
            lambda: self.query(expr),
            lambda: f"{what}: {expr} not empty; log:\n{self.log.read_text()[-3000:]}",
            every=0.5,
        )


@contextmanager
def prometheus(tmp: Path, targets: Mapping[str, int]) -> Iterator[Prometheus]:
    """Prometheus scraping ``127.0.0.1:PORT`` for each job name in ``targets``, with the shipped rules."""
    assert PROMETHEUS is not None
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{p}"]}]} for job, p in targets.items()
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = tmp / "prometheus.log"
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    server = Prometheus(f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + READY_WAIT_S
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited {proc.returncode}: {log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready in {READY_WAIT_S:g} s (a hang): {log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
