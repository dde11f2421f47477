"""The worker's lease as a state machine, transition by transition, against a strict SQS and moto S3.

Every transition in the table is made by its owner and refused to any other role; every pair not
in the table is refused; final states stay final; a refused extension makes the lease LOST and a
LOST lease is never deleted; a transient read error is retried within the lease, never LOST.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timezone
from typing import Any

import pytest
from botocore.exceptions import ClientError
from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.models import ClaimRef, Item, Manifest, PoolSpec, QueueSettings
from calque.pool.worker.claims import ClaimChecker
from calque.pool.worker.lease import FINAL, LIVE, TRANSITIONS, IllegalTransition, Lease, Role, State
from calque.warm import WarmSupervisor

from pool.conftest import HERE
from pool.strict_sqs import StrictFakeSqs

MODEL = "org/lease"
BUCKET = "lease-bucket"


def _lease(state: State = State.CLAIMED, receipt: str = "r-1") -> Lease:
    lease = Lease(message_id="m-1", receipt=receipt, body="{}", receive_count=1)
    lease._state = state  # the starting point of one transition under test
    return lease


@pytest.mark.parametrize(("src", "dst"), sorted(TRANSITIONS, key=lambda t: (t[0].value, t[1].value)))
def test_each_transition_is_made_by_its_owner_and_refused_to_every_other_role(src: State, dst: State) -> None:
    owner = TRANSITIONS[(src, dst)]
    for role in Role:
        if role is owner:
            continue
        lease = _lease(src)
        with pytest.raises(IllegalTransition, match=f"belongs to the {owner.value}"):
            lease.advance(dst, role)
        assert lease.state is src
    lease = _lease(src)
    lease.advance(dst, owner)
    assert lease.state is dst


def test_transitions_not_in_the_table_raise_for_every_role() -> None:
    missing = [(a, b) for a, b in itertools.product(State, State) if (a, b) not in TRANSITIONS]
    assert (State.WORKING, State.DELETED) in missing  # a claim is never deleted before its Summary
    assert (State.LOST, State.SUMMARISED) in missing  # a lost claim is never summarised
    for src, dst in missing:
        for role in Role:
            lease = _lease(src)
            with pytest.raises(IllegalTransition, match="no transition"):
                lease.advance(dst, role)
            assert lease.state is src


def test_final_states_have_no_way_out_and_every_live_state_can_be_lost() -> None:
    assert not [t for t in TRANSITIONS if t[0] in FINAL]
    assert all(TRANSITIONS[(s, State.LOST)] is Role.KEEPER for s in LIVE)
    assert frozenset(State) - FINAL == LIVE


def test_a_late_owner_is_told_its_lease_was_taken_instead_of_raising() -> None:
    lease = _lease(State.WORKING)
    lease.advance(State.LOST, Role.KEEPER)  # the heartbeat's extension was refused mid-drain
    assert lease.advance_unless_taken(State.WRITING, Role.RUNNER) is False
    assert lease.state is State.LOST
    released = _lease(State.WRITING)
    released.advance(State.RELEASED, Role.STOPPER)
    assert released.advance_unless_taken(State.SUMMARISED, Role.WRITER) is False


# -- against a strict SQS ---------------------------------------------------------------------------


@pytest.fixture
def sqs() -> tuple[StrictFakeSqs, PoolQueue]:
    fake = StrictFakeSqs(visibility_timeout=600)
    return fake, PoolQueue(fake, MODEL)


def _received(fake: StrictFakeSqs, pq: PoolQueue, state: State = State.CLAIMED) -> Lease:
    fake.send_message(QueueUrl=fake.URL, MessageBody="{}")
    (m,) = pq.receive(0, 1)
    lease = Lease(message_id=m["MessageId"], receipt=m["ReceiptHandle"], body=m["Body"], receive_count=1)
    lease._state = state
    return lease


def test_a_refused_extension_makes_the_lease_lost_and_a_lost_lease_is_never_deleted(sqs: Any) -> None:
    fake, pq = sqs
    lease = _received(fake, pq, State.SUMMARISED)
    refused: list[Exception] = []
    assert lease.extend(lambda r: pq.extend(r, 600), refused.append) is True
    fake.expire(lease.message_id)  # the lease ran out unnoticed; SQS may hand it to another worker
    assert lease.extend(lambda r: pq.extend(r, 600), refused.append) is False
    assert lease.state is State.LOST and len(refused) == 1
    assert lease.delete(pq.ack) is False
    assert fake.delete_calls == [] and lease.message_id in fake.messages


def test_the_writers_last_check_fails_unless_the_lease_is_still_writing(sqs: Any) -> None:
    fake, pq = sqs
    lease = _received(fake, pq, State.WRITING)
    assert lease.extend(lambda r: pq.extend(r, 600), lambda e: None, require=State.WRITING) is True
    lease.advance(State.RELEASED, Role.STOPPER)
    assert lease.extend(lambda r: pq.extend(r, 600), lambda e: None, require=State.WRITING) is False


def test_summarised_then_deleted_removes_the_message(sqs: Any) -> None:
    fake, pq = sqs
    lease = _received(fake, pq, State.WRITING)
    lease.advance(State.SUMMARISED, Role.WRITER)
    assert lease.delete(pq.ack) is True
    assert lease.state is State.DELETED and lease.message_id not in fake.messages


def test_release_gives_the_message_back_at_once_and_only_once(sqs: Any) -> None:
    fake, pq = sqs
    lease = _received(fake, pq, State.CLAIMED)
    assert lease.release(pq.release, Role.STOPPER) == (True, None)
    assert lease.state is State.RELEASED
    assert pq.receive(0, 1)  # visible again at once
    assert lease.release(pq.release, Role.STOPPER) == (False, None)


def test_a_refused_delete_abandons_the_lease_for_redelivery(sqs: Any) -> None:
    from calque.errors import CalqueError

    fake, pq = sqs
    lease = _received(fake, pq, State.SUMMARISED)

    def refuse(receipt: str) -> None:
        raise CalqueError("test: SQS refused the delete")

    with pytest.raises(CalqueError):
        lease.delete(refuse)
    assert lease.state is State.ABANDONED


# -- preparing: a transient read error is not lost --------------------------------------------------


class FlakyS3:
    """The moto S3 client, failing its first ``failures`` reads with a 503 (S3's SlowDown)."""

    def __init__(self, s3: Any, failures: int) -> None:
        self._s3 = s3
        self.failures = failures
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s3, name)

    def _maybe_fail(self) -> None:
        self.reads += 1
        if self.reads <= self.failures:
            raise ClientError({"Error": {"Code": "SlowDown", "Message": "test: slow down"}}, "GetObject")

    def head_object(self, **kw: Any) -> Any:
        self._maybe_fail()
        return self._s3.head_object(**kw)

    def get_object(self, **kw: Any) -> Any:
        self._maybe_fail()
        return self._s3.get_object(**kw)


def _claim_checker(failures: int, moto: str) -> tuple[ClaimChecker, Lease, FlakyS3]:
    s3 = client("s3")
    s3.create_bucket(Bucket=BUCKET)
    spec = PoolSpec(model=MODEL, workload=str(HERE / "workloads" / "gated.py"), bucket=BUCKET,
                    queue=QueueSettings(receive_wait=1), spot_watch=False)  # fmt: skip
    good = RunStore(s3, BUCKET, "calque", "q")
    prefix = good.run_prefix("run-1")
    uri = good.put_manifest(prefix, Manifest(run_id="run-1", claim_id="c0", model=MODEL, method="work",
                                             items=[Item(index=0, args=[1])]))  # fmt: skip
    ref = ClaimRef(run_id="run-1", claim_id="c0", model=MODEL, method="work", manifest_uri=uri,
                   results_prefix=prefix, item_count=1, submitted_at=datetime.now(timezone.utc))  # fmt: skip
    flaky = FlakyS3(s3, failures)
    checker = ClaimChecker(spec, WarmSupervisor.load(spec), RunStore(flaky, BUCKET, "calque", "q"),
                           wait=lambda s: False, retry_delays_s=(0.01, 0.01, 0.01))  # fmt: skip
    lease = Lease(message_id="m-1", receipt="r-1", body=ref.model_dump_json(), receive_count=1)
    return checker, lease, flaky


def test_a_transient_read_error_is_retried_within_the_lease_and_the_claim_runs(moto: str) -> None:
    checker, lease, flaky = _claim_checker(2, moto)
    checker.prepare(lease)
    assert lease.state is State.CLAIMED and lease.prepared is not None
    assert lease.prepared.method == "work" and flaky.reads > 2


def test_a_read_that_keeps_failing_abandons_the_claim_and_never_calls_it_lost(moto: str) -> None:
    checker, lease, _ = _claim_checker(100, moto)
    checker.prepare(lease)
    assert lease.state is State.ABANDONED and lease.prepared is None and lease.problem is None


def test_a_claim_lost_while_it_was_being_prepared_is_neither_poisoned_nor_readied() -> None:
    from calque.pool.worker.lease import Prepared

    prefix = "s3://b/calque/runs/run-1/"
    manifest = Manifest(run_id="run-1", claim_id="c0", model=MODEL, method="work", items=[Item(index=0, args=[1])])
    ref = ClaimRef(run_id="run-1", claim_id="c0", model=MODEL, method="work", manifest_uri=f"{prefix}m.json",
                   results_prefix=prefix, item_count=1, submitted_at=datetime.now(timezone.utc))  # fmt: skip
    for verdict in ("poison", "ready"):
        lease = _lease(State.CLAIMED)
        lease.advance(State.LOST, Role.KEEPER)  # the heartbeat lost it during a slow manifest read
        done = lease.poison("bad claim") if verdict == "poison" else lease.ready(Prepared(ref, manifest, "work"))
        assert done is False and lease.state is State.LOST
        assert lease.problem is None and lease.prepared is None
