"""The warm pool worker: claim, heartbeat, drain, write results then Summary, and only then delete.

One ``Worker`` serves one pool queue with one ``WarmSupervisor`` (``@enter`` ran once, at start).
Threads, each with one job:

- main (``serve``): takes the next claim, drains its items, hands the outcome to the writer;
- receiver: long-polls the queue and *prepares* the next claim (parses the ClaimRef, checks for an
  existing Summary, reads the manifest) while the current one drains, so claims run back to back;
- heartbeat: extends every held claim's visibility every VT/3; a failed extension marks the
  claim lost, and a lost claim is neither summarised nor deleted (another worker owns it now);
- writer: for each finished claim, writes the results under this attempt's own key, confirms the
  lease, writes the Summary (only if the claim has none: it names the results it vouches for),
  deletes the message: in that order, behind the next claim's work. An attempt that lost its
  lease can at worst leave an orphaned results object that no Summary names and nothing reads;
  it never touches another attempt's results;
- spot watcher (optional): an IMDSv2 spot interruption notice stops the worker like SIGTERM.

Stopping (SIGTERM, a spot notice, the idle timeout): stop receiving, release every unfinished
claim with visibility 0 so another worker takes it at once, flush finished ones, run ``@exit``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue as queue_mod
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from calque.aws.queue import PoolQueue
from calque.aws.store import ManifestProblem, RunStore, StoreError, parse_s3_uri
from calque.errors import CalqueError, format_validation_error
from calque.models import ClaimRef, ItemResult, Manifest, PoolSpec, Summary
from calque.models.ids import is_safe_id
from calque.pool.cost import claim_cost
from calque.pool.metrics import Metrics
from calque.pool.spot import SpotWatcher, imds_allowed
from calque.pool.submit import DEFAULT_METHOD
from calque.warm import WarmSupervisor

log = logging.getLogger("calque.pool.worker")
# Writer threads: each claim's writes stay in order (results, Summary, delete) on one thread, while
# several claims' writes overlap, so a fast method is not held back by S3/SQS round trips.
_WRITERS = 3


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(eq=False)
class Lease:
    """One received message and what the worker knows about it."""

    message_id: str
    receipt: str
    body: str
    receive_count: int
    received_at: datetime = field(default_factory=_now)
    last_extended: float = field(default_factory=time.monotonic)
    lost: bool = False
    done: bool = False
    # part of this attempt's results key: unique even if two attempts shared receive count and worker id
    token: str = field(default_factory=lambda: secrets.token_hex(4))
    # filled by prepare()
    ref: ClaimRef | None = None
    manifest: Manifest | None = None
    method: str | None = None
    poison: str | None = None
    duplicate: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _Finished:
    lease: Lease
    results: list[ItemResult]
    summary: Summary


@dataclass
class WorkerReport:
    """What one worker did before it stopped (logged at exit)."""

    worker_id: str
    stop_reason: str
    claims: int
    enter_count: int
    exit_errors: list[str]


class Worker:
    """Serve ``spec``'s pool queue with ``supervisor`` until stopped. Clients are injected."""

    def __init__(
        self,
        spec: PoolSpec,
        supervisor: WarmSupervisor,
        pool_queue: PoolQueue,
        store: RunStore,
        *,
        worker_id: str | None = None,
        metrics: Metrics | None = None,
        instance_type: str | None = None,
    ) -> None:
        self.spec = spec
        self.sup = supervisor
        self.queue = pool_queue
        self.store = store
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self.instance_type = instance_type or spec.instance_type
        self.metrics = metrics or Metrics({"model": spec.model, "worker": self.worker_id})
        self.vt = pool_queue.visibility_timeout()
        self.heartbeat_s = spec.heartbeat_s or max(self.vt / 3.0, 0.1)
        self.receive_wait = min(spec.queue.receive_wait, 20)
        self._stop = threading.Event()
        self.stop_reason = ""
        self._held: set[Lease] = set()
        self._held_lock = threading.Lock()
        self._slot: queue_mod.Queue[Lease] = queue_mod.Queue(maxsize=1)
        self._writes: queue_mod.Queue[_Finished | None] = queue_mod.Queue()
        self._enter_charged = False
        self._claims = 0
        self._threads: list[threading.Thread] = []
        self._receiver: threading.Thread | None = None
        self._spot: SpotWatcher | None = None
        self.metrics.set("calque_pool_enter_count", supervisor.enter_count)
        self.metrics.set("calque_pool_enter_seconds", supervisor.enter_seconds)
        self.metrics.set("calque_pool_up", 1)

    # -- control ------------------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Ask the worker to stop (safe from a signal handler or any thread)."""
        if not self._stop.is_set():
            self.stop_reason = reason
            self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- leases -------------------------------------------------------------------------------------

    def _hold(self, lease: Lease) -> None:
        with self._held_lock:
            self._held.add(lease)
            self.metrics.set("calque_pool_leases_held", len(self._held))

    def _drop(self, lease: Lease) -> None:
        with lease.lock:
            lease.done = True
        with self._held_lock:
            self._held.discard(lease)
            self.metrics.set("calque_pool_leases_held", len(self._held))

    def _extend(self, lease: Lease) -> bool:
        """Extend ``lease`` to a full VT; False (and marked lost) when SQS says it is not ours."""
        with lease.lock:
            if lease.done:
                return True
            if lease.lost:
                return False
            try:
                self.queue.extend(lease.receipt, self.vt)
                lease.last_extended = time.monotonic()
                return True
            except CalqueError as exc:
                lease.lost = True
                self.metrics.inc("calque_pool_leases_lost_total")
                log.warning("lost the lease on message %s: %s", lease.message_id, exc)
                return False

    def _release(self, lease: Lease) -> None:
        with lease.lock:
            if lease.done or lease.lost:
                return
            try:
                self.queue.release(lease.receipt)
                log.info("released message %s (visibility 0)", lease.message_id)
            except CalqueError as exc:
                log.warning("could not release message %s: %s", lease.message_id, exc)
        self.metrics.inc("calque_pool_claims_total", outcome="released")
        self._drop(lease)

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        while not stop.wait(min(0.2, self.heartbeat_s)):
            now = time.monotonic()
            with self._held_lock:
                held = list(self._held)
            for lease in held:
                if not lease.done and not lease.lost and now - lease.last_extended >= self.heartbeat_s:
                    self._extend(lease)

    # -- receiving ----------------------------------------------------------------------------------

    def _receive_one(self, wait_s: int) -> Lease | None:
        try:
            msgs = self.queue.receive(wait_s, 1)
        except CalqueError as exc:
            log.warning("receive failed: %s; retrying in 1s", exc)
            self._stop.wait(1.0)
            return None
        if not msgs:
            return None
        m = msgs[0]
        attrs = m.get("Attributes", {})
        lease = Lease(
            message_id=m["MessageId"],
            receipt=m["ReceiptHandle"],
            body=m.get("Body", ""),
            receive_count=int(attrs.get("ApproximateReceiveCount", 1)),
        )
        self._hold(lease)
        return lease

    def _receiver_loop(self) -> None:
        while not self._stop.is_set():
            if self._slot.full():
                self._stop.wait(0.005)
                continue
            lease = self._receive_one(self.receive_wait)
            if lease is None:
                continue
            if self._stop.is_set():
                self._release(lease)
                return
            self.prepare(lease)
            self._slot.put(lease)

    def prepare(self, lease: Lease) -> None:
        """Parse and check a claim and read its manifest; sets ``poison`` or ``duplicate`` instead of raising."""
        try:
            ref = ClaimRef.model_validate_json(lease.body)
        except ValidationError as exc:
            lease.poison = f"unparseable ClaimRef: {format_validation_error(exc)}"
            return
        lease.ref = ref
        if lease.receive_count > self.spec.max_receive_count:
            lease.poison = (
                f"received {lease.receive_count} times, over the pool's max_receive_count "
                f"{self.spec.max_receive_count}: giving up on this claim"
            )
            return
        if ref.model != self.spec.model:
            lease.poison = f"claim is for model {ref.model!r} but this pool serves {self.spec.model!r}"
            return
        if ref.workload_digest and ref.workload_digest != self.sup.digest:
            lease.poison = (
                f"claim wants workload {ref.workload_digest} but this worker runs {self.sup.digest}: "
                "submit to the pool that runs that script and parameters"
            )
            return
        outside = self.store.outside_run(ref.run_id, ref.results_prefix, ref.manifest_uri)
        if outside:
            lease.poison = outside
            return
        try:
            if self.store.summary_exists(ref.results_prefix, ref.claim_id):
                lease.duplicate = True
                return
            manifest = self.store.read_manifest(ref.manifest_uri, self.spec.max_manifest_bytes)
        except ManifestProblem as exc:
            lease.poison = str(exc)
            return
        except CalqueError as exc:
            lease.poison = None
            log.warning("cannot read claim %s now (%s): it will be redelivered", ref.claim_id, exc)
            lease.lost = True  # not ours to finish: leave it for redelivery, do not summarise
            return
        if (manifest.run_id, manifest.claim_id, manifest.model) != (ref.run_id, ref.claim_id, ref.model):
            lease.poison = (
                f"manifest {ref.manifest_uri} is for run {manifest.run_id}/claim {manifest.claim_id}/model "
                f"{manifest.model}, not the claim's {ref.run_id}/{ref.claim_id}/{ref.model}"
            )
            return
        method: str | None = manifest.method
        if method == DEFAULT_METHOD:
            method = self.spec.method or self.sup.default_method()
            if method is None:
                lease.poison = f"the claim names no method and the pool has several {self.sup.methods}: use --method"
                return
        if method not in self.sup.workload.methods:
            lease.poison = (
                f"method {method!r} does not exist on {self.sup.workload.target_name} (it has {self.sup.methods})"
            )
            return
        lease.method = method
        lease.manifest = manifest

    def _next(self) -> Lease | None:
        if self.spec.prefetch:
            try:
                return self._slot.get(timeout=0.2)
            except queue_mod.Empty:
                return None
        lease = self._receive_one(self.receive_wait)
        if lease is not None:
            self.prepare(lease)
        return lease

    # -- serving ------------------------------------------------------------------------------------

    def serve(self) -> WorkerReport:
        """Serve until stopped (signal, spot notice, idle timeout); then shut down in order."""
        hb_stop = threading.Event()
        self._start(hb_stop)
        idle_since = time.monotonic()
        try:
            while not self._stop.is_set():
                lease = self._next()
                if lease is None:
                    idle = self.spec.idle_timeout_s
                    if idle is not None and time.monotonic() - idle_since > idle:
                        self.request_stop("idle")
                    continue
                self._handle(lease)
                idle_since = time.monotonic()
        finally:
            errors = self._shutdown(hb_stop)
        return WorkerReport(self.worker_id, self.stop_reason, self._claims, self.sup.enter_count, errors)

    def _start(self, hb_stop: threading.Event) -> None:
        specs: list[tuple[str, Any, tuple[Any, ...]]] = [("calque-heartbeat", self._heartbeat_loop, (hb_stop,))]
        specs += [("calque-writer", self._writer_loop, ()) for _ in range(_WRITERS)]
        for name, target, args in specs:
            t = threading.Thread(target=target, args=args, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        if self.spec.prefetch:
            self._receiver = threading.Thread(target=self._receiver_loop, name="calque-receiver", daemon=True)
            self._receiver.start()
        if self.spec.spot_watch and imds_allowed(self.spec.imds_endpoint):
            self._spot = SpotWatcher(
                self.spec.imds_endpoint, self.spec.spot_poll_s, lambda a: self.request_stop("spot")
            )
            self._spot.start()

    def _handle(self, lease: Lease) -> None:
        if lease.lost:
            self._drop(lease)
            return
        if lease.duplicate:
            log.info("claim of message %s already has a Summary: deleting without re-running", lease.message_id)
            self._ack(lease)
            self.metrics.inc("calque_pool_claims_total", outcome="duplicate")
            return
        if lease.poison is not None or lease.manifest is None or lease.ref is None or lease.method is None:
            self._poison(lease, lease.poison or "claim could not be prepared")
            return
        self._run(lease, lease.ref, lease.manifest, lease.method)

    def _run(self, lease: Lease, ref: ClaimRef, manifest: Manifest, method: str) -> None:
        started_at, t0 = _now(), time.monotonic()

        def should_stop() -> str | None:
            if lease.lost:
                return "lost"
            return "shutdown" if self._stop.is_set() else None

        drain = self.sup.drain(method, manifest.items, should_stop=should_stop)
        if drain.stopped == "lost":
            log.warning("claim %s/%s lost mid-run: not summarising, not deleting", ref.run_id, ref.claim_id)
            self.metrics.inc("calque_pool_claims_total", outcome="lost")
            self._drop(lease)
            return
        if drain.stopped == "shutdown":
            self._release(lease)
            return
        warm_hit = self._enter_charged
        enter_paid = 0.0 if warm_hit else self.sup.enter_seconds
        self._enter_charged = True
        claim_seconds = time.monotonic() - t0
        failed = sum(1 for r in drain.results if not r.ok)
        summary = self._summary(
            ref,
            lease,
            ok=drain.error is None,
            error=drain.error,
            items=len(manifest.items),
            failed=failed,
            warm_hit=warm_hit,
            enter_paid=enter_paid,
            started_at=started_at,
            claim_seconds=claim_seconds,
            method_seconds=drain.method_seconds,
            method=method,
            results_key=self.store.attempt_results_key(
                ref.claim_id, max(lease.receive_count, 1), self.worker_id, lease.token
            ),
        )
        self._claims += 1
        self.metrics.inc("calque_pool_items_total", len(drain.results) - failed, outcome="ok")
        self.metrics.inc("calque_pool_items_total", failed, outcome="failed")
        if warm_hit:
            self.metrics.inc("calque_pool_warm_hits_total")
        self.metrics.inc("calque_pool_claim_seconds_sum", claim_seconds)
        self.metrics.inc("calque_pool_claim_seconds_count")
        self._writes.put(_Finished(lease, drain.results, summary))

    def _summary(
        self,
        ref: ClaimRef | None,
        lease: Lease,
        *,
        ok: bool,
        error: str | None,
        items: int,
        failed: int,
        warm_hit: bool,
        enter_paid: float,
        started_at: datetime,
        claim_seconds: float,
        method_seconds: float,
        method: str | None = None,
        run_id: str = "",
        claim_id: str = "",
        results_key: str | None = None,
    ) -> Summary:
        cost = None
        if self.instance_type:
            cost = claim_cost(self.instance_type, enter_paid, claim_seconds, items)
        return Summary(
            run_id=ref.run_id if ref else run_id,
            claim_id=ref.claim_id if ref else claim_id,
            model=ref.model if ref else self.spec.model,
            method=method or (ref.method if ref else ""),
            ok=ok,
            error=error,
            items=items,
            failed=failed,
            warm_hit=warm_hit,
            enter_seconds_paid=enter_paid,
            enter_count=self.sup.enter_count,
            attempt=max(lease.receive_count, 1),
            worker_id=self.worker_id,
            instance_type=self.instance_type,
            workload_digest=self.sup.digest,
            started_at=started_at,
            finished_at=_now(),
            claim_seconds=claim_seconds,
            method_seconds=method_seconds,
            cost=cost,
            results_key=results_key,
        )

    def _poison(self, lease: Lease, error: str) -> None:
        """A failed Summary (or a poison record when the message names no run), then delete."""
        log.error("poison claim in message %s: %s", lease.message_id, error)
        ref = lease.ref
        partial = _partial_ref(lease.body)
        run_id = ref.run_id if ref else partial.get("run_id")
        claim_id = ref.claim_id if ref else partial.get("claim_id")
        prefix = ref.results_prefix if ref else partial.get("results_prefix")
        count = ref.item_count if ref else partial.get("item_count")
        items = count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else 0
        try:
            # the failed Summary goes where the submitter looks, only if that is this pool's own key
            # for safe ids; anything else (a crafted ../ id, another prefix) gets a poison record
            if is_safe_id(run_id) and is_safe_id(claim_id) and prefix == self.store.run_prefix(str(run_id)):
                summary = self._summary(
                    ref,
                    lease,
                    ok=False,
                    error=error,
                    items=items,
                    failed=items,
                    warm_hit=self._enter_charged,
                    enter_paid=0.0,
                    started_at=lease.received_at,
                    claim_seconds=0.0,
                    method_seconds=0.0,
                    run_id=str(run_id),
                    claim_id=str(claim_id),
                    method=str(partial.get("method") or ""),
                )
                if not self.store.put_summary(str(prefix), summary, if_absent=True):
                    log.info("claim of message %s already has a Summary: deleting it", lease.message_id)
            else:
                self.store.put_poison(lease.message_id, lease.body, error)
        except CalqueError as exc:
            log.error("cannot record poison claim %s (%s): leaving it for the DLQ", lease.message_id, exc)
            self._drop(lease)
            return
        self.metrics.inc("calque_pool_claims_total", outcome="poison")
        self._ack(lease)

    def _ack(self, lease: Lease) -> None:
        with lease.lock:
            if lease.lost or lease.done:
                return
            try:
                self.queue.ack(lease.receipt)
            except CalqueError as exc:
                log.warning("could not delete message %s: %s (it will be redelivered)", lease.message_id, exc)
        self._drop(lease)

    # -- writing ------------------------------------------------------------------------------------

    def _writer_loop(self) -> None:
        while True:
            item = self._writes.get()
            if item is None:
                return
            self._write(item)

    def _write(self, f: _Finished) -> None:
        lease, s = f.lease, f.summary
        assert lease.ref is not None and s.results_key is not None
        prefix = lease.ref.results_prefix
        written: str | None = None
        try:
            # Results first, under this attempt's own key: no other attempt writes there, so a late
            # write (a lease that ran out unnoticed) can orphan an object but never replace results
            # that a Summary vouches for. Then confirm the lease right before the Summary, which is
            # written only if the claim has none: the first finished attempt wins, and readers
            # follow its results_key. A lost lease writes no Summary and does not delete the message.
            if not lease.lost:
                written = self.store.put_results(prefix, s.claim_id, f.results, s.results_key)
            if not self._extend(lease):
                log.warning("claim %s/%s is no longer ours: no Summary, no delete", s.run_id, s.claim_id)
                self.metrics.inc("calque_pool_claims_total", outcome="lost")
                self._drop(lease)
                self._discard(written)
                return
            if self.store.put_summary(prefix, s, if_absent=True):
                self.metrics.inc("calque_pool_claims_total", outcome="ok" if s.ok else "failed")
            else:
                existing = self.store.get_summary(prefix, s.claim_id)
                if existing is None:  # a write in flight lost (S3's 409): let the claim come back
                    raise StoreError(f"the Summary of claim {s.claim_id} is being written by another attempt")
                if existing.results_key == s.results_key:  # our own earlier write landed (a retried PUT)
                    self.metrics.inc("calque_pool_claims_total", outcome="ok" if s.ok else "failed")
                else:
                    log.warning(
                        "claim %s/%s was finished by another attempt first: keeping its Summary, dropping ours",
                        s.run_id,
                        s.claim_id,
                    )
                    self.metrics.inc("calque_pool_claims_total", outcome="duplicate")
                    self._discard(written)
        except CalqueError as exc:
            log.error("cannot write claim %s/%s (%s): it will be redelivered", s.run_id, s.claim_id, exc)
            self._drop(lease)
            return
        self._ack(lease)
        if self.spec.metrics_textfile:
            with contextlib.suppress(OSError):
                self.metrics.write_textfile(self.spec.metrics_textfile)

    def _discard(self, uri: str | None) -> None:
        """Best effort: delete this attempt's orphaned results (unread either way; ``sweep`` finds leftovers)."""
        if uri is None:
            return
        try:
            self.store.delete(uri)
        except CalqueError as exc:
            log.info("left orphaned results %s (%s): nothing reads them", uri, exc)

    # -- stopping -----------------------------------------------------------------------------------

    def _release_prefetched(self) -> None:
        while True:
            try:
                self._release(self._slot.get_nowait())
            except queue_mod.Empty:
                return

    def _shutdown(self, hb_stop: threading.Event) -> list[str]:
        self.request_stop(self.stop_reason or "stopped")
        self.metrics.set("calque_pool_up", 0)
        log.info("stopping (%s)", self.stop_reason)
        if self._spot is not None:
            self._spot.stop()
        self._release_prefetched()  # before waiting out the receiver's long poll
        if self._receiver is not None:
            self._receiver.join(timeout=self.receive_wait + 2.0)
        self._release_prefetched()
        for _ in range(_WRITERS):
            self._writes.put(None)
        for t in self._threads:
            if t.name == "calque-writer":
                t.join(timeout=self.spec.shutdown_grace_s)
        # anything still held and not being written: give it back now
        with self._held_lock:
            leftover = list(self._held)
        for lease in leftover:
            self._release(lease)
        hb_stop.set()
        self.sup.exit_timeout_s = self.spec.shutdown_grace_s
        errors = self.sup.close()
        for e in errors:
            log.error("@exit hook failed: %s", e)
        if self.spec.metrics_textfile:
            with contextlib.suppress(OSError):
                self.metrics.write_textfile(self.spec.metrics_textfile)
        return errors


def _partial_ref(body: str) -> dict[str, Any]:
    """What can be salvaged from a broken ClaimRef to put its failed Summary where the submitter looks."""
    try:
        doc = json.loads(body)
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    prefix = doc.get("results_prefix")
    if isinstance(prefix, str):
        try:
            parse_s3_uri(prefix)
        except ValueError:
            doc.pop("results_prefix")
    return doc
