"""Versions are enforced on what crosses a boundary, and ids that become S3 keys are safe, in the models."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from calque.configfile import load_model
from calque.errors import UsageError, format_validation_error
from calque.models import ClaimRef, Manifest, PoolSpec, RunRecord, Summary
from calque.models.base import VersionedModel, current_version
from calque.models.ids import is_safe_id
from calque.models.session import SessionRequest
from calque.session.session_config import load_config
from pydantic import ValidationError

NOW = datetime(2026, 11, 30, tzinfo=timezone.utc)
REF = {
    "run_id": "run-1",
    "claim_id": "c00000",
    "model": "m",
    "method": "work",
    "manifest_uri": "s3://b/calque/pools/q/runs/run-1/manifests/c00000.json",
    "results_prefix": "s3://b/calque/pools/q/runs/run-1/",
    "item_count": 1,
    "submitted_at": NOW.isoformat(),
}
MANIFEST = {"run_id": "run-1", "claim_id": "c00000", "model": "m", "method": "work", "items": []}


def _message(exc: ValidationError) -> str:
    return format_validation_error(exc)


@pytest.mark.parametrize(("model", "doc"), [(ClaimRef, REF), (Manifest, MANIFEST)])
def test_a_newer_version_is_refused_naming_both_versions_and_what_to_upgrade(
    model: type[VersionedModel], doc: dict[str, object]
) -> None:
    # a newer writer may also add fields: the version is the one problem reported
    body = json.dumps({**doc, "version": 7, "priority": "high"})
    with pytest.raises(ValidationError) as err:
        model.model_validate_json(body)
    assert _message(err.value) == (
        f"{model.__name__} version 7 is newer than this calque reads (version {current_version(model)}): "
        "upgrade calque on the pool's workers (this one did not run the claim)"
    )


def test_manifest_version_99_and_claimref_version_7_no_longer_validate() -> None:
    with pytest.raises(ValidationError, match="version 99 is newer"):
        Manifest.model_validate({**MANIFEST, "version": 99})
    with pytest.raises(ValidationError, match="version 7 is newer"):
        ClaimRef.model_validate({**REF, "version": 7})


@pytest.mark.parametrize("version", [0, -1])
def test_versions_start_at_one(version: int) -> None:
    with pytest.raises(ValidationError, match=f"version {version} is not one this calque reads"):
        ClaimRef.model_validate({**REF, "version": version})


def test_the_current_version_and_an_omitted_one_read() -> None:
    assert ClaimRef.model_validate({**REF, "version": current_version(ClaimRef)}).version == 1
    assert ClaimRef.model_validate(REF).version == 1


def test_every_boundary_model_is_versioned() -> None:
    from calque.models import CohortSpec, ItemResult, RunReport, Session, SessionResponse, UsageReport
    from calque.session.session_config import SessionConfig

    for model in (ClaimRef, Manifest, Summary, ItemResult, RunRecord, RunReport, PoolSpec, CohortSpec):
        assert issubclass(model, VersionedModel), model
    for model in (Session, SessionRequest, SessionResponse, UsageReport, SessionConfig):
        assert issubclass(model, VersionedModel), model


def test_a_newer_session_frame_says_protocol() -> None:
    with pytest.raises(ValidationError, match="protocol version 2 is newer than this calque reads"):
        SessionRequest.model_validate_json('{"version": 2, "op": "ping"}')


def test_a_newer_config_file_names_the_file_and_the_versions(tmp_path: Path) -> None:
    spec = tmp_path / "pool.yaml"
    spec.write_text("version: 3\nmodel: m\nworkload: w.py\nbucket: bkt\n")
    with pytest.raises(UsageError) as err:
        load_model(PoolSpec, spec, "pool spec")
    assert str(err.value) == (
        f"pool spec {spec}: pool spec version 3 is newer than this calque reads (version 1): "
        "upgrade calque on this host, or write the spec for the version it reads"
    )
    cfg = tmp_path / "session.yaml"
    cfg.write_text("version: 2\n")
    with pytest.raises(UsageError, match=f"session config {cfg}: session config version 2 is newer"):
        load_config(cfg)


@pytest.mark.parametrize("bad", ["../../x", "..", "a/b", "a..b", ".hidden", "", "x" * 129, "sp ace", "é"])
def test_unsafe_ids_are_refused_in_every_model_that_makes_keys_of_them(bad: str) -> None:
    assert not is_safe_id(bad)
    with pytest.raises(ValidationError, match="claim_id"):
        ClaimRef.model_validate({**REF, "claim_id": bad})
    with pytest.raises(ValidationError, match="run_id"):
        Manifest.model_validate({**MANIFEST, "run_id": bad})
    record = {
        "run_id": "run-1",
        "model": "m",
        "method": "w",
        "queue_name": "q",
        "results_prefix": "s3://b/p/",
        "item_count": 1,
        "claims": [bad],
        "submitted_at": NOW,
    }
    with pytest.raises(ValidationError, match=r"claims\.0"):
        RunRecord.model_validate(record)


def test_a_refused_id_says_what_to_use() -> None:
    with pytest.raises(ValidationError) as err:
        ClaimRef.model_validate({**REF, "claim_id": "../../x"})
    assert _message(err.value) == (
        "claim_id='../../x': '../../x' is not a safe identifier: use 1 to 128 characters from A-Z a-z 0-9 . _ -, "
        "starting with a letter or digit, without '..'; change claim_id"
    )


@pytest.mark.parametrize("ok", ["c00000", "run-20261130T220000-abc123", "A.b_c-1", "x" * 128])
def test_the_ids_calque_makes_are_safe(ok: str) -> None:
    assert is_safe_id(ok)


@pytest.mark.parametrize(("field", "value"), [("prefix", "calque/../other"), ("queue_name", "q/../../x")])
def test_pool_spec_key_parts_are_safe(field: str, value: str) -> None:
    with pytest.raises(ValidationError, match=field):
        PoolSpec.model_validate({"model": "m", "workload": "w.py", "bucket": "bkt", field: value})


def test_an_older_reader_meeting_a_newer_summary_says_what_to_upgrade(moto: str) -> None:
    from calque.aws.aws_errors import StoreError
    from calque.aws.clients import client
    from calque.aws.store import RunStore

    s3 = client("s3")
    s3.create_bucket(Bucket="runs")
    store = RunStore(s3, "runs", "calque", "q")
    prefix = store.run_prefix("run-1")
    store.put(f"{prefix}summaries/c00000.json", json.dumps({"version": 2, "claim_id": "c00000"}).encode())
    with pytest.raises(StoreError) as err:
        store.summaries(prefix)
    assert str(err.value) == (
        f"{prefix}summaries/c00000.json is not a valid Summary: Summary version 2 is newer than this calque "
        "reads (version 1): upgrade calque where the results are read (calque pool results/status)"
    )


def test_results_of_a_run_id_that_is_not_an_id_are_refused_before_s3() -> None:
    from calque.pool.submitter.submit import PoolTarget, load_run

    with pytest.raises(UsageError, match=r"run id '\.\./\.\./x' is not one calque makes"):
        load_run(PoolTarget("m", "bucket"), "../../x")
