"""Who runs a ramp's worker (``ramp.py``), the one difference between the tiers: on AWS the ramp's
instance does (its user-data starts ``calque-pool-worker.service``); offline (``CALQUE_OFFLINE=1``:
moto's instances run nothing) a local worker process stands in for it, started on the very spec text
the user-data carries.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Protocol

from calque.aws.acquire.acquirer import Acquirer
from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.errors import CalqueError, InfrastructureError, UsageError
from calque.models import PoolSpec
from calque.pool.bootstrap import write_spec


class RampWorker(Protocol):
    where: str

    def check(self) -> None:
        """Raise when the worker can no longer serve (it exited)."""

    def stop(self) -> None:
        """Stop the worker (the instance's ends with the instance)."""


class InstanceWorker:
    """On AWS: the instance's user-data started the worker; terminating the instance stops it."""

    CHECK_EVERY_S = 30.0

    def __init__(self, acquirer: Acquirer, cohort: str, instance_id: str) -> None:
        self.acquirer, self.cohort = acquirer, cohort
        self.where = f"on instance {instance_id} (calque-pool-worker.service, started by its user-data)"
        self._checked = time.monotonic()

    def check(self) -> None:
        """Every 30 s: the instance is still alive (a TTL, a spot reclaim or a failed boot ends it)."""
        if time.monotonic() - self._checked < self.CHECK_EVERY_S:
            return
        self._checked = time.monotonic()
        live = [i for i in self.acquirer.status(self.cohort).instances if i.state in ("pending", "running")]
        if not live:
            raise InfrastructureError(
                f"the ramp's instance (cohort {self.cohort}) is no longer running; see its console output and "
                "/var/log/calque-bootstrap.log"
            )

    def stop(self) -> None:
        return None


def _load_failure(spec: PoolSpec) -> str | None:
    """The ramp's worker's load error from its load record, when it failed to load."""
    from calque.aws.store import RunStore
    from calque.pool.submitter.loads import LoadRecords, health, load_error

    s3 = client("s3", region=spec.region, endpoint_url=spec.endpoint_url)
    store = RunStore(s3, spec.bucket, spec.prefix, PoolQueue(None, spec.model, spec.queue_name).name)
    try:
        failing = health(LoadRecords(store).read()).failing
    except CalqueError:
        return None
    return None if failing is None else str(load_error(failing, spec.model))


class LocalStandIn:
    """Offline: a local ``calque pool worker --spec`` on the spec the user-data carries."""

    def __init__(self, spec: PoolSpec) -> None:
        from calque.pool.bootstrap import start_worker_process

        self.spec = spec
        self.dir = Path(tempfile.mkdtemp(prefix="calque-ramp-"))
        self.spec_path = write_spec(spec, self.dir / "pool.yaml")
        self.log_path = self.dir / "worker.log"
        self.bound_s = spec.queue.receive_wait + 2 * spec.shutdown_grace_s + 5
        env = {**os.environ, "CALQUE_WORKLOAD_CACHE": str(self.dir / "workloads")}
        with self.log_path.open("wb") as log:
            self.proc = start_worker_process(self.spec_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.where = f"in local process {self.proc.pid} (offline stand-in for the instance; log {self.log_path})"

    def _tail(self, lines: int = 12) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def check(self) -> None:
        code = self.proc.poll()
        if code is None:
            return
        msg = f"the ramp's worker exited with code {code} before the ramp ended:\n{self._tail()}"
        failed = _load_failure(self.spec)
        if failed is not None:  # the caller's workload did not load: theirs to fix, as a usage error
            raise UsageError(f"{msg}\n{failed}")
        raise UsageError(msg) if code == UsageError.exit_code else InfrastructureError(msg)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: release claims, run @exit once, exit 0
            try:
                self.proc.wait(timeout=self.bound_s + 5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
