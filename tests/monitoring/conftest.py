"""The monitoring tests use the session tests' host (a real daemon on a simulated GPU host, real
Unix users) and the pool tests' workers (real processes on the moto server)."""

from __future__ import annotations

from pool.conftest import make_pool  # noqa: F401 (fixtures, used by name)
from session.conftest import host, make_user  # noqa: F401
