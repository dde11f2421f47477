"""Reading many small S3 objects under one prefix, without pydantic: one LIST, then the GETs at once.

A pool's load records are read this way (``calque.pool.submitter.load_reads``): by ``calque pool status``, which
imports no pydantic, and by ``calque.pool.submitter.loads``, which fetches only the objects whose ETag changed.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from calque.aws.aws_errors import StoreError, aws_errors, is_not_found, translate


def list_etags(s3: Any, bucket: str, key_prefix: str, what: str) -> dict[str, str]:
    """Every key under ``key_prefix`` and its ETag; ``what`` names the objects in an error."""
    listed: dict[str, str] = {}
    with aws_errors(f"list the {what} under s3://{bucket}/{key_prefix}", error=StoreError):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key_prefix):
            listed.update({o["Key"]: o.get("ETag", "") for o in page.get("Contents", [])})
    return listed


def _get(s3: Any, bucket: str, key: str) -> bytes | None:
    try:
        data: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        return data
    except (ClientError, BotoCoreError) as exc:
        if is_not_found(exc):
            return None
        raise translate(exc, f"read s3://{bucket}/{key}", error=StoreError) from exc


def get_many(s3: Any, bucket: str, keys: list[str]) -> list[bytes | None]:
    """Each key's bytes, None for one deleted since it was listed; up to eight GETs at once, so many
    small objects cost about one round trip."""
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(keys))), thread_name_prefix="calque-objects") as pool:
        return list(pool.map(lambda k: _get(s3, bucket, k), keys))
