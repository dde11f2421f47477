"""Preparing a received claim (the claimer's job): parse and check the ClaimRef, read its manifest.

The outcome is a transition of the lease: POISONED (with the reason a failed Summary will carry),
DUPLICATE (its Summary exists), or a ``Prepared`` claim that stays CLAIMED until the runner starts
it. A transient S3 error is not a verdict on the claim: the read is retried while the heartbeat
keeps the lease, and only a read that keeps failing abandons it (SQS redelivers it after the VT).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from calque.aws.store import ManifestProblem, RunStore, parse_s3_uri
from calque.errors import CalqueError, format_validation_error
from calque.models import ClaimRef, Manifest, PoolSpec
from calque.models.pool import DEFAULT_METHOD
from calque.pool.worker.crashes import verdict
from calque.pool.worker.lease import Lease, Prepared, Role, State
from calque.warm import WarmSupervisor

log = logging.getLogger("calque.pool.worker.loop")
READ_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)  # well within a VT: the heartbeat extends the lease meanwhile


@dataclass
class ClaimChecker:
    """Everything ``prepare`` checks a claim against: the pool's spec, the warm workload, the store."""

    spec: PoolSpec
    sup: WarmSupervisor
    store: RunStore
    wait: Callable[[float], bool]  # sleeps, True when the worker is stopping (``Event.wait``)
    queue_limit: int | None = None  # the queue's redrive maxReceiveCount (else the spec's queue settings)
    retry_delays_s: tuple[float, ...] = READ_RETRY_DELAYS_S

    def prepare(self, lease: Lease) -> None:
        """Check ``lease``'s claim and read its manifest; the verdict is the lease's next state."""
        verdict = self._check(lease)
        if isinstance(verdict, Prepared):
            lease.ready(verdict)
        elif isinstance(verdict, _Poison):
            lease.poison(verdict.reason)
        elif isinstance(verdict, _Duplicate):
            lease.advance_unless_taken(State.DUPLICATE, Role.CLAIMER)
        else:
            log.warning("cannot read claim of message %s (%s): it will be redelivered", lease.message_id, verdict.error)
            lease.advance_unless_taken(State.ABANDONED, Role.CLAIMER)

    def _check(self, lease: Lease) -> Prepared | _Poison | _Duplicate | _Unreadable:
        spec, sup = self.spec, self.sup
        try:
            ref = ClaimRef.model_validate_json(lease.body)
        except ValidationError as exc:
            return _Poison(f"unparseable ClaimRef: {format_validation_error(exc)}")
        lease.ref = ref
        limit = self.queue_limit or spec.queue.max_receive_count
        if lease.attempt > limit:  # only re-sends carry a message past SQS's own redrive
            return _Poison(
                f"received {lease.attempt} times (across graceful re-sends), over the queue's maxReceiveCount "
                f"{limit}: giving up on this claim"
            )
        if ref.model != spec.model:
            return _Poison(f"claim is for model {ref.model!r} but this pool serves {spec.model!r}")
        if ref.workload_digest and ref.workload_digest != sup.digest:
            return _Poison(
                f"claim wants workload {ref.workload_digest} but this worker runs {sup.digest}: "
                "submit to the pool that runs that script and parameters"
            )
        outside = self.store.outside_run(ref.run_id, ref.results_prefix, ref.manifest_uri)
        if outside:
            return _Poison(outside)
        manifest = self._read(lease, ref)
        if not isinstance(manifest, Manifest):
            return manifest
        if (manifest.run_id, manifest.claim_id, manifest.model) != (ref.run_id, ref.claim_id, ref.model):
            return _Poison(
                f"manifest {ref.manifest_uri} is for run {manifest.run_id}/claim {manifest.claim_id}/model "
                f"{manifest.model}, not the claim's {ref.run_id}/{ref.claim_id}/{ref.model}"
            )
        ended = verdict(self.store, ref, lease.attempt, spec.max_receive_count)
        if ended:
            return _Poison(ended)
        method: str | None = manifest.method
        if method == DEFAULT_METHOD:
            method = spec.method or sup.default_method()
            if method is None:
                return _Poison(f"the claim names no method and the pool has several {sup.methods}: use --method")
        if method not in sup.workload.methods:
            return _Poison(f"method {method!r} does not exist on {sup.workload.target_name} (it has {sup.methods})")
        return Prepared(ref, manifest, method)

    def _read(self, lease: Lease, ref: ClaimRef) -> Manifest | _Poison | _Duplicate | _Unreadable:
        """The manifest, retrying transient S3 errors within the lease."""
        error = "stopped before it could be read"
        for delay in (0.0, *self.retry_delays_s):
            if delay and (self.wait(delay) or lease.state is not State.CLAIMED):
                break  # stopping, or the lease was taken away meanwhile
            try:
                if self.store.summary_exists(ref.results_prefix, ref.claim_id):
                    return _Duplicate()
                return self.store.read_manifest(ref.manifest_uri, self.spec.max_manifest_bytes)
            except ManifestProblem as exc:
                return _Poison(str(exc))
            except CalqueError as exc:
                error = str(exc)
                log.info("reading claim %s failed (%s): retrying within the lease", ref.claim_id, exc)
        return _Unreadable(error)


@dataclass(frozen=True)
class _Poison:
    reason: str


@dataclass(frozen=True)
class _Duplicate:
    pass


@dataclass(frozen=True)
class _Unreadable:
    error: str


def partial_ref(body: str) -> dict[str, Any]:
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
