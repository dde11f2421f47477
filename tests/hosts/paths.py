"""Where the harness keeps images, runs and their state (git-ignored ``build/hosts/``)."""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOSTS_DIR = Path(os.environ.get("CALQUE_HOSTS_DIR", REPO / "build" / "hosts")).resolve()
RUNS_DIR = HOSTS_DIR / "runs"
# The debootstrapped image (and the .debs it came from) is shared by every checkout on the machine,
# as ansible-test shares its virtualenvs: a few CPU-minutes the first time, then none, whichever
# worktree or CI clone asks. Runs (host copies, state) stay in the checkout's build/hosts/.
_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
IMAGES_DIR = Path(os.environ.get("CALQUE_HOSTS_IMAGES", _cache / "calque" / "test-hosts")).resolve()
# Every network namespace the harness makes starts with this, so `down --all` finds a crashed run's.
# It names this checkout (a hash of build/hosts' path): two checkouts on one machine, each running
# its own tests, never share a namespace name nor tear down each other's.
NETNS_PREFIX = f"cth-{hashlib.sha256(str(HOSTS_DIR).encode()).hexdigest()[:6]}-"
# How long a wait for an event (a boot, sshd, a socket) may take before it is called a hang: the same
# ceiling as the tests' support.waits.HANG_S, read here because this package also runs outside pytest
# (``python -m tests.hosts``, the sandbox's local host), where ``support`` is not importable.
HANG_S = float(os.environ.get("CALQUE_TEST_HANG_S", "300"))


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created), so concurrent runs build a cached thing once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
