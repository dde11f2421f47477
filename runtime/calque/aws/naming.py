"""Names derived from a model: one queue per model, never shared by two models."""

from __future__ import annotations

import hashlib
import re

QUEUE_PREFIX = "calque-pool-"
MAX_QUEUE_NAME = 80
DLQ_SUFFIX = "-dlq"
_HASH_LEN = 8
# Leave room for "-dlq" so the dead-letter queue's name is valid too.
_MAX_BASE = MAX_QUEUE_NAME - len(DLQ_SUFFIX)
_UNSAFE = re.compile(r"[^a-z0-9]+")


def slug(model: str) -> str:
    """Lower-case alphanumerics joined by single dashes, e.g. 'meta-llama/Llama-3' -> 'meta-llama-llama-3'."""
    return _UNSAFE.sub("-", model.lower()).strip("-")


def model_hash(model: str) -> str:
    return hashlib.sha256(model.encode("utf-8")).hexdigest()[:_HASH_LEN]


def pool_queue_name(model: str) -> str:
    """``calque-pool-<slug>-<8 hex of sha256(model)>``, at most 76 characters (80 with ``-dlq``).

    The hash of the exact model string keeps two distinct models apart even when their slugs are
    equal or truncated to the same prefix (the Go original collided there).
    """
    if not model:
        raise ValueError("model must be a non-empty string")
    digest = model_hash(model)
    room = _MAX_BASE - len(QUEUE_PREFIX) - 1 - _HASH_LEN
    body = slug(model)[:room].strip("-") or "model"
    return f"{QUEUE_PREFIX}{body}-{digest}"


def dlq_name(queue_name: str) -> str:
    return f"{queue_name}{DLQ_SUFFIX}"


def pool_key_base(prefix: str, queue_name: str) -> str:
    """The key under which every object of one pool lives: ``<prefix>/pools/<queue name>``.

    The workers' IAM policy (``calque.aws.iam_policy``) grants exactly this prefix, so it is computed
    here once for both.
    """
    return "/".join(p for p in (prefix.strip("/"), "pools", queue_name) if p)
