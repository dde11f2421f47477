"""Where a pool's load records live and how fresh they count: the contract between the worker that
writes its record (``pool/worker/loadguard.py``) and the submitters and ``calque pool status`` that
read them (``pool/submitter/loads.py``, ``load_reads.py``). Standard library only, so the
pydantic-free status path reads it too."""

from __future__ import annotations

import re
from typing import Protocol

# A serving worker refreshes its record this often; three missed refreshes and it no longer counts.
HEARTBEAT_S = 60.0
LIVE_S = 3 * HEARTBEAT_S
# A failure counts this long: longer than the longest backoff hold plus a restart delay and a load.
FRESH_S = 900.0

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class RunPlace(Protocol):
    """Where a pool's objects are: a ``RunStore``'s bucket and the pool's key base."""

    @property
    def bucket(self) -> str: ...

    @property
    def base(self) -> str: ...


def load_prefix(store: RunPlace) -> str:
    """The ``s3://`` prefix under which a pool's workers write their load records, one object per slot."""
    return f"s3://{store.bucket}/{store.base}/load/"


def slot_uri(store: RunPlace, slot: str) -> str:
    """The load record of one worker slot (``gpu-a/0``), its name made safe for a key."""
    return f"{load_prefix(store)}{_UNSAFE.sub('-', slot).strip('-') or 'worker'}.json"
