"""Version numbers of the documents and protocols calque reads, and the one rule for reading them.

Standard library only: the session client's fast path (``calque session status`` and ``list``)
checks an answer's version without importing pydantic; ``models/base.py``'s ``VersionedModel`` applies
the same rule to every model that crosses a boundary.
"""

from __future__ import annotations

from typing import Any

# Bump when the session socket protocol changes incompatibly; the daemon refuses other versions.
SESSION_PROTOCOL_VERSION = 1

# Bump when a pool model that crosses a process boundary (calque.models.pool, .poolload) changes
# incompatibly. Here rather than beside the models so that the pool views (no pydantic) read it too.
POOL_SCHEMA_VERSION = 1


def check_version_number(label: str, version: Any, newest: int, upgrade_hint: str, oldest: int = 1) -> None:
    """The rule for a document called ``label`` whose reader knows versions ``oldest`` to ``newest``."""
    if not isinstance(version, int) or isinstance(version, bool):
        return
    if version > newest:
        raise ValueError(
            f"{label} version {version} is newer than this calque reads (version {newest}): {upgrade_hint}"
        )
    if version < oldest:
        raise ValueError(f"{label} version {version} is not one this calque reads (versions {oldest} to {newest})")
