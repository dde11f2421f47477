"""``RunStore``: a pool's runs in S3.

Layout under ``s3://<bucket>/<prefix>/pools/<queue name>/``::

    runs/<run_id>/run.json                                    RunRecord (what submit staged)
    runs/<run_id>/manifests/<claim_id>.json                   Manifest (one claim's items)
    runs/<run_id>/results/<claim_id>/<attempt>-<worker>-<token>.jsonl
                                                              one attempt's ItemResults, in item order
    runs/<run_id>/summaries/<claim_id>.json                   Summary: names the results object it vouches for
    poison/<message id>.json                                  a message too broken to name its run

Every attempt at a claim writes its results to a key of its own, so no attempt can overwrite
another's. The Summary (one per claim, written only after its results, and only if absent) names
the results object it vouches for in ``results_key``; readers follow it and never read results that
no Summary names. A worker whose lease ran out while it wrote leaves an orphan that nothing reads
(``orphaned_results``/``sweep`` find and delete them). "This claim's Summary exists" is one HEAD.
A Summary without ``results_key`` (older workers) vouches for ``results/<claim_id>.jsonl``.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError
from pydantic import BaseModel, ValidationError

from calque.aws.aws_errors import StoreError, aws_errors, is_not_found, is_precondition_failed, translate
from calque.aws.naming import pool_key_base
from calque.errors import format_validation_error
from calque.models import ItemError, ItemResult, Manifest, RunRecord, Summary

# The ItemError type of an item whose claim ended without its result (poisoned, dead-lettered, cut short).
CLAIM_FAILED = "calque.ClaimFailed"
_UNSAFE_KEY_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


class ManifestProblem(Exception):
    """A claim's manifest is missing, too large or invalid (the claim is poison)."""


M = TypeVar("M", bound=BaseModel)


def _parse(model: type[M], data: bytes, uri: str) -> M:
    """``model`` from an object's bytes; StoreError naming the object and every problem (a newer version too)."""
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise StoreError(format_validation_error(exc, f"{uri} is not a valid {model.__name__}")) from exc


def parse_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://") or "/" not in uri[5:]:
        raise ValueError(f"not an s3://bucket/key URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    return bucket, key


class RunStore:
    """Reads and writes one pool's runs. ``s3`` is a boto3 S3 client (see ``calque.aws.clients``)."""

    def __init__(self, s3: Any, bucket: str, prefix: str, queue_name: str) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.base = pool_key_base(prefix, queue_name)

    # -- keys ---------------------------------------------------------------------------------------

    def run_prefix(self, run_id: str) -> str:
        """``s3://bucket/.../runs/<run_id>/`` (the ClaimRef's ``results_prefix``)."""
        return f"s3://{self.bucket}/{self.base}/runs/{run_id}/"

    def outside_run(self, run_id: str, results_prefix: str, manifest_uri: str) -> str | None:
        """Why a claim's URIs are not this pool's own keys for ``run_id``; None when they are.

        A worker writes only under its pool's ``runs/<run_id>/`` and reads manifests only from there,
        so a message cannot steer it into another bucket, another pool or a ``..`` key.
        """
        own = self.run_prefix(run_id)
        if results_prefix != own:
            return f"claim's results_prefix {results_prefix} is not this pool's prefix for run {run_id} ({own})"
        segments = manifest_uri[len(own) :].split("/")
        if not manifest_uri.startswith(own) or any(p in ("", ".", "..") for p in segments):
            return f"claim's manifest {manifest_uri} lies outside this pool's prefix for run {run_id} ({own})"
        return None

    @staticmethod
    def manifest_uri(results_prefix: str, claim_id: str) -> str:
        return f"{results_prefix}manifests/{claim_id}.json"

    @staticmethod
    def results_uri(results_prefix: str, claim_id: str, results_key: str | None = None) -> str:
        """Where a claim's vouched-for results are: ``results_key`` (relative to the run), or the legacy key."""
        return f"{results_prefix}{results_key or f'results/{claim_id}.jsonl'}"

    @staticmethod
    def attempt_results_key(claim_id: str, attempt: int, worker_id: str, token: str) -> str:
        """``results/<claim>/<attempt>-<worker>-<token>.jsonl``: one attempt's own key (relative to the run).

        ``attempt`` is SQS's (approximate) receive count and ``worker_id`` names the process; the
        random ``token`` makes the key unique even if two attempts shared both.
        """
        worker = _UNSAFE_KEY_CHARS.sub("_", worker_id).strip("_") or "worker"
        return f"results/{claim_id}/{attempt}-{worker}-{token}.jsonl"

    @staticmethod
    def vouches_for(summary: Summary) -> str:
        """The results key (relative to the run) that ``summary`` vouches for; ValueError if it points elsewhere."""
        legacy = f"results/{summary.claim_id}.jsonl"
        key = summary.results_key or legacy
        if key != legacy and (not key.startswith(f"results/{summary.claim_id}/") or ".." in key.split("/")):
            raise ValueError(f"Summary of claim {summary.claim_id} names results outside its claim: {key!r}")
        return key

    @staticmethod
    def summary_uri(results_prefix: str, claim_id: str) -> str:
        return f"{results_prefix}summaries/{claim_id}.json"

    def poison_uri(self, message_id: str) -> str:
        return f"s3://{self.bucket}/{self.base}/poison/{message_id}.json"

    # -- raw ----------------------------------------------------------------------------------------

    def put(self, uri: str, body: bytes, content_type: str = "application/json") -> None:
        bucket, key = parse_s3_uri(uri)
        with aws_errors(f"write {uri}", error=StoreError):
            self.s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type)

    def get(self, uri: str, max_bytes: int | None = None) -> bytes | None:
        """The object's bytes, or None when it does not exist. ManifestProblem when over ``max_bytes``."""
        bucket, key = parse_s3_uri(uri)
        try:
            resp = self.s3.get_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            if is_not_found(exc):
                return None
            raise translate(exc, f"read {uri}", error=StoreError) from exc
        size = int(resp.get("ContentLength", 0))
        if max_bytes is not None and size > max_bytes:
            resp["Body"].close()
            raise ManifestProblem(f"manifest {uri} is {size} bytes, over the pool's limit of {max_bytes}")
        data: bytes = resp["Body"].read()
        return data

    def put_if_absent(self, uri: str, body: bytes, content_type: str = "application/json") -> bool:
        """Write ``uri`` only if no object is there (S3 conditional write); False when one already is.

        An S3 client too old to send ``If-None-Match`` writes unconditionally (last writer wins).
        """
        bucket, key = parse_s3_uri(uri)
        try:
            self.s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type, IfNoneMatch="*")
            return True
        except ParamValidationError:
            self.put(uri, body, content_type)
            return True
        except (ClientError, BotoCoreError) as exc:
            if is_precondition_failed(exc):
                return False
            raise translate(exc, f"write {uri}", error=StoreError) from exc

    def delete(self, uri: str) -> None:
        bucket, key = parse_s3_uri(uri)
        with aws_errors(f"delete {uri}", error=StoreError):
            self.s3.delete_object(Bucket=bucket, Key=key)

    def exists(self, uri: str) -> bool:
        bucket, key = parse_s3_uri(uri)
        try:
            self.s3.head_object(Bucket=bucket, Key=key)
            return True
        except (ClientError, BotoCoreError) as exc:
            if is_not_found(exc):
                return False
            raise translate(exc, f"check {uri}", error=StoreError) from exc

    def _keys(self, uri_prefix: str) -> list[str]:
        bucket, key = parse_s3_uri(uri_prefix)
        out: list[str] = []
        with aws_errors(f"list {uri_prefix}", error=StoreError):
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
                out += [o["Key"] for o in page.get("Contents", [])]
        return out

    def keys(self, uri_prefix: str) -> list[str]:
        """Every key under ``uri_prefix`` (``s3://bucket/prefix``), in S3's order."""
        return self._keys(uri_prefix)

    def _put_model(self, uri: str, model: BaseModel) -> None:
        self.put(uri, model.model_dump_json().encode())

    # -- the submitter's side -----------------------------------------------------------------------

    def put_manifest(self, results_prefix: str, manifest: Manifest) -> str:
        uri = self.manifest_uri(results_prefix, manifest.claim_id)
        self.put(uri, manifest.to_json().encode())
        return uri

    def put_run(self, record: RunRecord) -> None:
        self._put_model(record.results_prefix + "run.json", record)

    def get_run(self, run_id: str) -> RunRecord | None:
        uri = self.run_prefix(run_id) + "run.json"
        data = self.get(uri)
        return None if data is None else _parse(RunRecord, data, uri)

    def summaries(self, results_prefix: str) -> dict[str, Summary]:
        """Every Summary written so far for a run, by claim id."""
        out: dict[str, Summary] = {}
        bucket = parse_s3_uri(results_prefix)[0]
        for key in self._keys(results_prefix + "summaries/"):
            uri = f"s3://{bucket}/{key}"
            data = self.get(uri)
            if data is not None:
                s = _parse(Summary, data, uri)
                out[s.claim_id] = s
        return out

    def summary_count(self, results_prefix: str) -> int:
        return len(self._keys(results_prefix + "summaries/"))

    def get_summary(self, results_prefix: str, claim_id: str) -> Summary | None:
        uri = self.summary_uri(results_prefix, claim_id)
        data = self.get(uri)
        return None if data is None else _parse(Summary, data, uri)

    def summary_claims(self, results_prefix: str) -> list[str]:
        """Claim ids that have a Summary so far (one LIST per 1,000 claims)."""
        return [k.rsplit("/", 1)[-1].removesuffix(".json") for k in self._keys(results_prefix + "summaries/")]

    def claim_results(self, results_prefix: str, summary: Summary, indices: range | None) -> list[ItemResult]:
        """The results ``summary`` vouches for, plus a failed result for each of ``indices`` they lack.

        A claim that ended without results for some items (poisoned, dead-lettered, cut short) still
        gives every item a result a user can see, with the claim's error as the reason.
        """
        try:
            key = self.vouches_for(summary)
        except ValueError as exc:
            raise StoreError(str(exc)) from exc
        out: list[ItemResult] = []
        if summary.results_key is not None or summary.ok:
            uri = self.results_uri(results_prefix, summary.claim_id, key)
            data = self.get(uri)
            if data:
                out = [_parse(ItemResult, line, uri) for line in data.splitlines() if line.strip()]
        if indices is not None and len(out) < len(indices):
            have = {r.index for r in out}
            why = f"claim {summary.claim_id} ended without this item's result: {summary.error or 'no reason given'}"
            error = ItemError(type=CLAIM_FAILED, message=why)
            out += [ItemResult(index=i, ok=False, error=error, seconds=0.0) for i in indices if i not in have]
        return out

    def _claim_indices(self, record: RunRecord, summaries: dict[str, Summary], claim_id: str) -> range | None:
        # Claims hold contiguous items in claim order: the manifest says which; when it is missing or
        # broken (the claim's poison), the item counts of the claims before it do.
        try:
            data = self.get(self.manifest_uri(record.results_prefix, claim_id))
            if data is not None:
                idx = [i.index for i in Manifest.model_validate_json(data).items]
                return range(min(idx), max(idx) + 1) if idx else range(0)
        except (StoreError, ValidationError, ManifestProblem):
            pass
        start = 0
        for c in record.claims:
            if c == claim_id:
                return range(start, min(start + summaries[c].items, record.item_count))
            if c not in summaries:
                return None
            start += summaries[c].items
        return None

    def results(self, record: RunRecord) -> list[ItemResult]:
        """The run's ItemResults in item order: for each claim, the results its Summary vouches for.

        Claims without a Summary yet are skipped, and so is every results object no Summary names
        (an attempt that lost its lease, or one still writing). A claim whose Summary vouches for
        fewer results than it had items (poison, deadline) gives the missing ones a failed result.
        """
        out: list[ItemResult] = []
        summaries = self.summaries(record.results_prefix)
        for claim_id in record.claims:
            s = summaries.get(claim_id)
            if s is None:
                continue
            got = self.claim_results(record.results_prefix, s, None)
            if len(got) < s.items:
                got = self.claim_results(record.results_prefix, s, self._claim_indices(record, summaries, claim_id))
            out += got
        out.sort(key=lambda r: r.index)
        return out

    def orphaned_results(self, record: RunRecord) -> list[str]:
        """Results objects of the run's summarised claims that their Summary does not vouch for.

        Left by attempts that lost their lease (or lost the race to the Summary). Claims without a
        Summary are left alone: their attempt may still be writing.
        """
        try:
            vouched = {c: self.vouches_for(s) for c, s in self.summaries(record.results_prefix).items()}
        except ValueError as exc:
            raise StoreError(str(exc)) from exc
        bucket, run_key = parse_s3_uri(record.results_prefix)
        orphans: list[str] = []
        for key in self._keys(record.results_prefix + "results/"):
            rel = key[len(run_key) :]
            claim_id = rel[len("results/") :].split("/", 1)[0].removesuffix(".jsonl")
            if claim_id in vouched and rel != vouched[claim_id]:
                orphans.append(f"s3://{bucket}/{key}")
        return orphans

    def sweep(self, record: RunRecord, *, dry_run: bool = False) -> list[str]:
        """Delete the run's orphaned results (see ``orphaned_results``); returns their URIs."""
        orphans = self.orphaned_results(record)
        if not dry_run:
            for uri in orphans:
                self.delete(uri)
        return orphans

    # -- the worker's side --------------------------------------------------------------------------

    def read_manifest(self, uri: str, max_bytes: int) -> Manifest:
        """The manifest, or ManifestProblem (missing, too large, invalid) that makes the claim poison."""
        try:
            data = self.get(uri, max_bytes=max_bytes)
        except ValueError as exc:
            raise ManifestProblem(str(exc)) from exc
        if data is None:
            raise ManifestProblem(f"manifest {uri} does not exist")
        try:
            return Manifest.model_validate_json(data)
        except ValidationError as exc:
            raise ManifestProblem(format_validation_error(exc, f"manifest {uri} is invalid")) from exc

    def put_results(
        self, results_prefix: str, claim_id: str, results: list[ItemResult], results_key: str | None = None
    ) -> str:
        """Write one attempt's results at ``results_key`` (relative to the run; default the legacy key); its URI."""
        uri = self.results_uri(results_prefix, claim_id, results_key)
        body = "".join(r.model_dump_json() + "\n" for r in results).encode()
        self.put(uri, body, "application/x-ndjson")
        return uri

    def put_summary(self, results_prefix: str, summary: Summary, *, if_absent: bool = False) -> bool:
        """Write the claim's Summary; with ``if_absent``, only when it has none yet (False when it had)."""
        uri = self.summary_uri(results_prefix, summary.claim_id)
        if if_absent:
            return self.put_if_absent(uri, summary.model_dump_json().encode())
        self._put_model(uri, summary)
        return True

    def summary_exists(self, results_prefix: str, claim_id: str) -> bool:
        return self.exists(self.summary_uri(results_prefix, claim_id))

    def put_poison(self, message_id: str, body: str, error: str) -> str:
        uri = self.poison_uri(message_id)
        self.put(uri, json.dumps({"message_id": message_id, "error": error, "body": body[:65536]}).encode())
        return uri
