"""The Summary a worker writes for one claim attempt (finished, failed or poison), with its cost."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from calque.models import ClaimRef, PoolSpec, Summary
from calque.pool.cost import claim_cost
from calque.pool.worker.lease import Lease
from calque.warm import WarmSupervisor


def now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class SummaryMaker:
    """What every Summary of one worker shares: its spec, its warm supervisor, its identity."""

    spec: PoolSpec
    sup: WarmSupervisor
    worker_id: str
    instance_type: str | None

    def make(
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
            attempt=lease.attempt,
            worker_id=self.worker_id,
            instance_type=self.instance_type,
            workload_digest=self.sup.digest,
            started_at=started_at,
            finished_at=now(),
            claim_seconds=claim_seconds,
            method_seconds=method_seconds,
            cost=cost,
            results_key=results_key,
        )
