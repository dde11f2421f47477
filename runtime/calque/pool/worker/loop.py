"""The warm pool worker: claim, heartbeat, drain, write results then Summary, and only then delete.

One ``Worker`` serves one pool queue with one ``WarmSupervisor`` (``@enter`` ran once, at start).
Each received message is a ``Lease`` (``calque.pool.worker.lease``: named states, each transition owned by
one role). Threads, each with one job:

- main (``serve``, the runner): takes the next claim, drains its items (CLAIMED -> WORKING ->
  WRITING) and hands it to the writers; with ``prefetch`` off it also receives (the claimer);
- receiver (the claimer, ``prefetch``): long-polls the queue and prepares the next claims
  (``calque.pool.worker.claims``: parse, check, read the manifest) while the current one drains, as many
  as the runner drains in one receive-and-prepare round trip (``calque.pool.worker.intake``);
- heartbeat (the keeper): extends every live lease's visibility every VT/3; a refused extension
  makes the lease LOST, and a LOST claim is neither summarised nor deleted (another worker owns it);
- writers (``calque.pool.worker.writer``): results, the Summary, the delete, in that order, behind the
  next claim's work; poison and duplicate claims too; the deletes go out on one more thread, up
  to ten to a batch (``calque.pool.worker.batching``);
- spot watcher (optional): an IMDSv2 spot interruption notice stops the worker like SIGTERM;
- lifecycle watcher: on an Auto Scaling instance (``calque.pool.worker.instance``) the worker protects it
  from scale-in while it holds a claim, and a termination (target lifecycle state ``Terminated``)
  stops it like SIGTERM, then completes the drain hook.

Stopping (SIGTERM, a spot notice, the idle timeout; the stopper): stop receiving, release every
unfinished claim so another worker takes it at once (re-sent, ``calque.pool.worker.release``: a graceful
release is not a delivery attempt), flush finished ones, run ``@exit``.

The worker's witness (``calque.pool.worker.witness``, its parent process) hears which items run and that a
stop is on purpose, so that only a claim whose item ended the process is marked against it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue as queue_mod
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from calque.aws.imds import metadata_client
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.errors import CalqueError
from calque.models import PoolSpec
from calque.pool.worker.backlog import BacklogSampler
from calque.pool.worker.claims import ClaimChecker
from calque.pool.worker.instance import InstanceGuard, LifecycleWatcher, NoInstance
from calque.pool.worker.intake import Receiver
from calque.pool.worker.lease import LIVE, Lease, Prepared, Role, State
from calque.pool.worker.release import release_uncounted
from calque.pool.worker.spot import SpotWatcher
from calque.pool.worker.stream import chunk_sink
from calque.pool.worker.summaries import SummaryMaker, now
from calque.pool.worker.witness import NO_WITNESS, WitnessLine
from calque.pool.worker.worker_metrics import Metrics, worker_labels
from calque.pool.worker.writer import ClaimWriter, Finished
from calque.warm import WarmSupervisor
from calque.warm.drain_results import failed_drain

__all__ = ["Lease", "Worker", "WorkerReport"]

log = logging.getLogger("calque.pool.worker.loop")
# Writer threads: each claim's writes stay in order (results, Summary, delete) on one thread, while
# several claims' writes overlap, so a fast method is not held back by S3/SQS round trips.
_WRITERS = 3
# One receive waits at most this long: a stop (SIGTERM) waits out at most this much of a long poll
# instead of the queue's 20 s. SQS answers a poll as soon as a message is there, so only an idle
# worker's request rate changes (one a second: about $0.50 a month of SQS requests).
POLL_SLICE_S = 1
_UNSUMMARISED = frozenset({State.CLAIMED, State.WORKING, State.WRITING})


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
        instance: InstanceGuard | None = None,
        witness: WitnessLine = NO_WITNESS,
    ) -> None:
        self.spec = spec
        self.sup = supervisor
        self.queue = pool_queue
        self.store = store
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self.instance_type = instance_type or spec.instance_type
        self.metrics = metrics or Metrics(worker_labels(spec.model, self.worker_id, spec.pool))
        self.vt = pool_queue.visibility_timeout()
        self.heartbeat_s = spec.heartbeat_s or max(self.vt / 3.0, 0.1)
        self.receive_wait = min(spec.queue.receive_wait, 20, POLL_SLICE_S)
        self._stop = threading.Event()
        self.stop_reason = ""
        self._held: set[Lease] = set()
        self._held_lock = threading.Lock()
        self._enter_charged = False
        self._claims = 0
        self._threads: list[threading.Thread] = []
        self._receiver: threading.Thread | None = None
        self._spot: SpotWatcher | None = None
        self.instance: InstanceGuard = instance or NoInstance()  # scale-in protection and the drain hook
        self._lifecycle: LifecycleWatcher | None = None
        self.summaries = SummaryMaker(spec, supervisor, self.worker_id, self.instance_type)
        self.witness = witness  # told which items run, and that a stop is on purpose (calque.pool.worker.witness)
        self.checker = ClaimChecker(spec, supervisor, store, self._stop.wait, pool_queue.max_receive_count())
        self.receiver = Receiver(pool_queue, hold=self._hold, prepare=self.prepare, stop=self._stop,
                                 wait_s=self.receive_wait, paused=self.instance.held)  # fmt: skip
        self.writer = ClaimWriter(
            pool_queue,
            store,
            self.metrics,
            self.summaries,
            extend=self._extend,
            ended=self._drop,
            warm_hit=lambda: self._enter_charged,
            busy=self._unsummarised,
        )
        self.metrics.set("calque_pool_enter_count", supervisor.enter_count)
        self.metrics.set("calque_pool_enter_seconds", supervisor.enter_seconds)
        self.metrics.set("calque_pool_up", 1)
        if spec.backlog_target is not None:
            self.metrics.set("calque_pool_backlog_target", spec.backlog_target)

    # -- control ------------------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Ask the worker to stop (safe from a signal handler or any thread)."""
        if not self._stop.is_set():
            self.witness.stopping(reason)  # first: whatever ends this process from now on is no claim's doing
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
        self.instance.holding(self.worker_id, self._holds_any)

    def _drop(self, lease: Lease) -> None:
        """Stop holding a lease that reached a final state (the heartbeat no longer sees it)."""
        with self._held_lock:
            self._held.discard(lease)
            self.metrics.set("calque_pool_leases_held", len(self._held))
        self.instance.holding(self.worker_id, self._holds_any)

    def _unsummarised(self) -> bool:
        with self._held_lock:
            return any(lease.state in _UNSUMMARISED for lease in self._held)

    def _holds_any(self) -> bool:
        with self._held_lock:
            return bool(self._held)

    def _extend(self, lease: Lease, require: State | None = None) -> bool:
        """The keeper: extend ``lease`` to a full VT; False (and LOST) when SQS says it is not ours."""

        def refused(exc: CalqueError) -> None:
            self.metrics.inc("calque_pool_leases_lost_total")
            log.warning("lost the lease on message %s: %s", lease.message_id, exc)

        return lease.extend(lambda receipt: self.queue.extend(receipt, self.vt), refused, require=require)

    def _release(self, lease: Lease, by: Role = Role.STOPPER) -> None:
        # re-sent, not made visible again: a graceful release must not count as a delivery attempt
        released, error = lease.release(lambda receipt: release_uncounted(self.queue, lease, receipt), by)
        if released:
            if error is None:
                log.info("released message %s (re-sent for another worker)", lease.message_id)
            else:
                log.warning("could not release message %s: %s", lease.message_id, error)
            self.metrics.inc("calque_pool_claims_total", outcome="released")
        self._drop(lease)

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        while not stop.wait(min(0.2, self.heartbeat_s)):
            t = time.monotonic()
            with self._held_lock:
                held = list(self._held)
            for lease in held:
                if lease.state in LIVE and t - lease.last_extended >= self.heartbeat_s:
                    self._extend(lease)

    # -- receiving (the claimer) --------------------------------------------------------------------

    def prepare(self, lease: Lease) -> None:
        """Check a claim and read its manifest: POISONED, DUPLICATE, ABANDONED, or ready to run."""
        self.checker.prepare(lease)

    def _next(self) -> Lease | None:
        if self.spec.prefetch:
            try:
                return self.receiver.ready.get(timeout=0.2)
            except queue_mod.Empty:
                return None
        for lease in self.receiver.receive(self.receive_wait, 1):
            self.receiver.prepare(lease)
            return lease
        return None

    # -- serving (the runner) -----------------------------------------------------------------------

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
                try:
                    self._handle(lease)
                except Exception as exc:  # a bug or a failing store must not end the worker: the claim fails
                    log.exception("claim of message %s failed in the worker: %s", lease.message_id, exc)
                    self._drop(lease)  # not deleted: it comes back after the VT (no evidence against it)
                idle_since = time.monotonic()
        finally:
            errors = self._shutdown(hb_stop)
        return WorkerReport(self.worker_id, self.stop_reason, self._claims, self.sup.enter_count, errors)

    def _start(self, hb_stop: threading.Event) -> None:
        specs: list[tuple[str, Any, tuple[Any, ...]]] = [("calque-heartbeat", self._heartbeat_loop, (hb_stop,))]
        specs += [("calque-writer", self.writer.loop, (self._write_textfile,)) for _ in range(_WRITERS)]
        if self.spec.metrics_port is not None or self.spec.metrics_textfile:
            backlog = BacklogSampler(
                self.queue, self.metrics, self.spec.backlog_poll_s, self._stop, self._write_textfile
            )
            specs.append(("calque-backlog", backlog.loop, ()))
        for name, target, args in specs:
            t = threading.Thread(target=target, args=args, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        if self.spec.prefetch:
            self._receiver = threading.Thread(target=self.receiver.loop, name="calque-receiver", daemon=True)
            self._receiver.start()
        if self.spec.spot_watch and (imds := metadata_client(self.spec.imds_endpoint)) is not None:
            self._spot = SpotWatcher(imds, self.spec.spot_poll_s, lambda a: self.request_stop("spot"))
            self._spot.start()
        if not isinstance(self.instance, NoInstance):
            self.instance.register(self.worker_id)
            self._lifecycle = LifecycleWatcher(
                self.instance, self.spec.spot_poll_s, lambda: self.request_stop("terminating")
            )
            self._lifecycle.start()

    def _handle(self, lease: Lease) -> None:
        state = lease.state
        if state in (State.POISONED, State.DUPLICATE):
            self.writer.writes.put(lease)
        elif state is State.CLAIMED and lease.prepared is not None:
            self._run(lease, lease.prepared)
        elif state is State.CLAIMED:  # received while stopping: never prepared
            self._release(lease)
        else:  # ended while it waited (LOST, ABANDONED, RELEASED)
            self._drop(lease)

    def _run(self, lease: Lease, prepared: Prepared) -> None:
        if not lease.advance_unless_taken(State.WORKING, Role.RUNNER):
            self._drop(lease)
            return
        ref, manifest, method = prepared.ref, prepared.manifest, prepared.method
        started_at, t0 = now(), time.monotonic()

        def should_stop() -> str | None:
            if lease.state is State.LOST:
                return "lost"
            return "shutdown" if self._stop.is_set() else None

        sink = chunk_sink(self.store, ref.results_prefix, ref.claim_id, max(lease.receive_count, 1))

        def on_start(items: list[int]) -> None:  # a pipe write: the witness marks them if this process dies now
            self.witness.running(ref.results_prefix, ref.claim_id, lease.attempt, items)

        try:
            drain = self.sup.drain(method, manifest.items, should_stop=should_stop, on_chunk=sink,
                                   on_start=on_start, encoding=manifest.encoding)  # fmt: skip
        except Exception as exc:  # nothing a claim does may stop the worker: the claim fails instead
            log.exception("claim %s/%s failed in the worker", ref.run_id, ref.claim_id)
            drain = failed_drain(manifest.items, f"the worker could not run this claim: {type(exc).__name__}: {exc}")
        finally:
            self.witness.idle()
        if drain.stopped == "lost":
            log.warning("claim %s/%s lost mid-run: not summarising, not deleting", ref.run_id, ref.claim_id)
            self.metrics.inc("calque_pool_claims_total", outcome="lost")
            self._drop(lease)
            return
        if drain.stopped == "shutdown":
            self._release(lease, Role.RUNNER)
            return
        warm_hit = self._enter_charged
        enter_paid = 0.0 if warm_hit else self.sup.enter_seconds
        self._enter_charged = True
        claim_seconds = time.monotonic() - t0
        self.receiver.ahead.drained(claim_seconds)
        failed = sum(1 for r in drain.results if not r.ok)
        summary = self.summaries.make(
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
            results_key=self.store.attempt_results_key(ref.claim_id, lease.attempt, self.worker_id, lease.token),
        )
        self._claims += 1
        self.metrics.inc("calque_pool_items_total", len(drain.results) - failed, outcome="ok")
        self.metrics.inc("calque_pool_items_total", failed, outcome="failed")
        if warm_hit:
            self.metrics.inc("calque_pool_warm_hits_total")
        self.metrics.observe("calque_pool_claim_seconds", claim_seconds)
        if lease.advance_unless_taken(State.WRITING, Role.RUNNER):
            self.writer.writes.put(Finished(lease, drain.results, summary))
        else:  # lost after its last item: nothing to write
            self.metrics.inc("calque_pool_claims_total", outcome="lost")
            self._drop(lease)

    # -- stopping (the stopper) ---------------------------------------------------------------------

    def _write_textfile(self) -> None:
        if self.spec.metrics_textfile:
            with contextlib.suppress(OSError):
                self.metrics.write_textfile(self.spec.metrics_textfile)

    def _release_prefetched(self) -> None:
        while True:
            try:
                self._release(self.receiver.ready.get_nowait())
            except queue_mod.Empty:
                return

    def _shutdown(self, hb_stop: threading.Event) -> list[str]:
        self.request_stop(self.stop_reason or "stopped")
        self.metrics.set("calque_pool_up", 0)
        log.info("stopping (%s)", self.stop_reason)
        if self._spot is not None:
            self._spot.stop()
        if self._lifecycle is not None:
            self._lifecycle.stop()
        self._release_prefetched()  # before waiting out the receiver's long poll
        if self._receiver is not None:
            self._receiver.join(timeout=self.receive_wait + 2.0)
        self._release_prefetched()
        for _ in range(_WRITERS):
            self.writer.writes.put(None)
        for t in self._threads:
            if t.name == "calque-writer":
                t.join(timeout=self.spec.shutdown_grace_s)
        self.writer.deleter.close(self.spec.shutdown_grace_s)  # what the writers summarised, deleted
        # anything still held and not being written: give it back now
        with self._held_lock:
            leftover = [lease for lease in self._held if lease.state is not State.SUMMARISED]
        for lease in leftover:
            self._release(lease)
        hb_stop.set()
        self.sup.exit_timeout_s = self.spec.shutdown_grace_s
        errors = self.sup.close()
        for e in errors:
            log.error("@exit hook failed: %s", e)
        self._write_textfile()
        self.instance.leave(self.worker_id, drained=self.stop_reason == "terminating")
        return errors
