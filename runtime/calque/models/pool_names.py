"""Names of every AWS resource of one pool, derived from the pool's name (``lab-a/embedder``).

A pool is named by the lab that runs it, not by the model it serves: two labs serving the same
model get two queues, two groups and two roles, and one lab's teardown never finds the other's.
Each name is ``calque-<slug>-<8 hex of sha256(pool)>``: the hash of the exact pool name keeps two
pools apart even when their slugs are equal or truncated alike, and the base is short enough that
every derived name fits the strictest AWS limit it meets (IAM role names: 64 characters).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

POOL_TAG = "calque:pool"
"""Tag key on every resource of a pool; its value is the pool's name. calque refuses to adopt or
delete a resource whose tag names another pool."""
USAGE_TAG = "calque:usage"
"""Tag key on a pool's Auto Scaling group: the ``s3://`` prefix of its instances' usage records, so
the ledger finds them from the group (``ledger/budget_gate.py``)."""

MAX_POOL_NAME = 64
_SEGMENT = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
_POOL = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT}){{0,2}}")
RULE = (
    f"1 to {MAX_POOL_NAME} characters: 1 to 3 segments of a-z 0-9 and '-' joined by '/', "
    "each starting and ending with a letter or digit (for example 'lab-a/embedder')"
)

_PREFIX = "calque-"
_HASH_LEN = 8
_MAX_BASE = 54  # + "-worker" (7) stays within IAM's 64 for role names; + "-dlq" within SQS's 80
_UNSAFE = re.compile(r"[^a-z0-9]+")


def check_pool_name(name: str) -> str:
    """``name`` unchanged, or ValueError saying the rule."""
    if not isinstance(name, str) or len(name) > MAX_POOL_NAME or _POOL.fullmatch(name) is None:
        raise ValueError(f"pool name {name!r} is not valid: use {RULE}")
    return name


@dataclass(frozen=True)
class PoolNames:
    """Every name one pool's resources carry. Build with :func:`pool_names`."""

    pool: str
    base: str
    queue: str
    dlq: str
    group: str  # the Auto Scaling group
    template: str  # the launch template
    role: str  # the workers' IAM role
    instance_profile: str
    policy: str  # the role's inline policy

    @property
    def tags(self) -> dict[str, str]:
        """Tags every resource of this pool carries."""
        return {POOL_TAG: self.pool}


def pool_names(pool: str) -> PoolNames:
    """The names of ``pool``'s resources; ValueError for an invalid pool name."""
    check_pool_name(pool)
    digest = hashlib.sha256(pool.encode("utf-8")).hexdigest()[:_HASH_LEN]
    room = _MAX_BASE - len(_PREFIX) - 1 - _HASH_LEN
    body = _UNSAFE.sub("-", pool).strip("-")[:room].strip("-") or "pool"
    base = f"{_PREFIX}{body}-{digest}"
    return PoolNames(
        pool=pool,
        base=base,
        queue=base,
        dlq=f"{base}-dlq",
        group=base,
        template=base,
        role=f"{base}-worker",
        instance_profile=f"{base}-worker",
        policy=f"{base}-worker",
    )


def owned_by(tags: dict[str, str] | list[dict[str, str]] | None, pool: str) -> bool | None:
    """Whose is a resource, from its tags: True for ``pool``'s, False for another pool's, None if untagged.

    Accepts both shapes AWS returns: a mapping (SQS, S3 helpers) or a list of ``{Key, Value}``.
    """
    if not tags:
        return None
    mapping = tags if isinstance(tags, dict) else {t.get("Key", ""): t.get("Value", "") for t in tags}
    if POOL_TAG not in mapping:
        return None
    return mapping[POOL_TAG] == pool


class ForeignPoolError(ValueError):
    """A resource is tagged for another pool: calque neither adopts nor deletes it."""


def refuse_foreign(kind: str, name: str, tags: dict[str, str] | list[dict[str, str]] | None, pool: str) -> None:
    """Raise :class:`ForeignPoolError` when ``tags`` say the resource belongs to another pool."""
    if owned_by(tags, pool) is False:
        mapping = tags if isinstance(tags, dict) else {t.get("Key", ""): t.get("Value", "") for t in tags or []}
        raise ForeignPoolError(
            f"{kind} {name!r} is tagged {POOL_TAG}={mapping.get(POOL_TAG)!r}, not {pool!r}: calque will not adopt "
            "or delete another pool's resource; choose another pool name or remove that resource by hand"
        )
