"""A real worker refuses crafted and newer claims, records why, and writes nothing outside its pool's keys."""

from __future__ import annotations

import json

import pytest
from calque.aws.clients import client
from calque.models import ClaimRef, Manifest

from pool.conftest import PROC_WAIT, RUN_WAIT, Pool, wait_until

pytestmark = pytest.mark.slow


def test_crafted_ids_newer_versions_and_foreign_uris_are_poison_and_nothing_escapes_the_pool(make_pool) -> None:
    pool: Pool = make_pool()
    store = pool.store
    good = pool.submit([1], batch_size=1)
    prefix = good.results_prefix
    sqs, url = client("sqs"), pool.queue.url()
    base = json.loads(ClaimRef(
        run_id=good.run_id, claim_id="x", model=pool.model, method="work", manifest_uri=prefix + "manifests/x.json",
        results_prefix=prefix, item_count=1, submitted_at=good.submitted_at,
    ).model_dump_json())  # fmt: skip

    def send(claim_id: str, **changes: object) -> None:
        body = {**base, "claim_id": claim_id, "manifest_uri": f"{prefix}manifests/{claim_id}.json", **changes}
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps(body))

    def stage(claim_id: str, **changes: object) -> None:
        m = Manifest(run_id=good.run_id, claim_id=claim_id, model=pool.model, method="work", items=[])
        doc = {**json.loads(m.model_dump_json()), "items": [{"index": 0, "args": [5]}], **changes}
        store.put(f"{prefix}manifests/{claim_id}.json", json.dumps(doc).encode())

    other_run = prefix.replace(f"/runs/{good.run_id}/", "/runs/other-run/")
    foreign = prefix.replace(f"/pools/{pool.queue.name}/", "/pools/someone-else/")
    stage("v2claim")
    send("v2claim", version=2, priority="high")  # a newer submitter's claim, with a field v1 lacks
    stage("v2manifest", version=3)
    send("v2manifest")
    stage("stray")
    send("stray", manifest_uri=f"{other_run}manifests/c00000.json")
    send("dotted", manifest_uri=f"{prefix}manifests/../../../x.json")
    send("../../x", manifest_uri=f"{prefix}manifests/../../x.json")
    send("foreign", results_prefix=foreign, manifest_uri=f"{foreign}manifests/foreign.json")
    send("c1", run_id="../escape", results_prefix=prefix.replace(good.run_id, "../escape"))
    w = pool.start()
    want = {
        "v2claim": "ClaimRef version 2 is newer than this calque reads (version 1): upgrade calque on the pool",
        "v2manifest": "Manifest version 3 is newer than this calque reads (version 2): upgrade calque on the pool's",
        "stray": f"manifest {other_run}manifests/c00000.json lies outside this pool's prefix for run {good.run_id}",
        "dotted": "lies outside this pool's prefix",
    }
    wait_until(lambda: len(store.summaries(prefix)) >= len(want) + 1, RUN_WAIT, "every failed Summary and the good one")
    summaries = store.summaries(prefix)
    assert summaries["c00000"].ok
    for claim_id, text in want.items():
        s = summaries[claim_id]
        assert not s.ok and s.error and text in s.error, (claim_id, s.error)
        assert s.items == 1 and s.failed == 1  # the claim's items are counted as failed, never run
    assert "start 5" not in w.stdout()  # no refused claim ran its item

    # the three claims with unsafe ids or a foreign prefix get poison records (by SQS message id), not Summaries
    def poison() -> list[dict[str, str]]:
        s3 = client("s3")
        keys = s3.list_objects_v2(Bucket=pool.bucket, Prefix=store.base + "/poison/").get("Contents", [])
        return [json.loads(s3.get_object(Bucket=pool.bucket, Key=k["Key"])["Body"].read()) for k in keys]

    records = wait_until(lambda: len(poison()) >= 3 and poison(), PROC_WAIT, "three poison records")
    errors = sorted(r["error"] for r in records)
    assert any("claim_id='../../x': '../../x' is not a safe identifier" in e for e in errors), errors
    assert any("run_id='../escape': '../escape' is not a safe identifier" in e for e in errors), errors
    assert any(f"results_prefix {foreign} is not this pool's prefix" in e for e in errors), errors
    wait_until(lambda: pool.queue.depth().visible + pool.queue.depth().in_flight == 0, PROC_WAIT, "an empty queue")

    keys = [o["Key"] for o in client("s3").list_objects_v2(Bucket=pool.bucket).get("Contents", [])]
    assert not [k for k in keys if ".." in k.split("/") or "someone-else" in k or "escape" in k], keys
    assert all(k.startswith(f"{store.base}/") for k in keys), keys
    assert w.proc.poll() is None  # the worker keeps serving
