"""A worker's load-record slot on this host: stable across its restarts, distinct beside other workers.

A slot names one load record (``calque.pool.submitter.loads``). ``--index N`` (systemd template units, the
children of ``workers: N``) gives ``<host>-N``. Without an index, several workers of one pool may
still run side by side on a host (by hand, the sandbox's stand-ins): each takes the first free
``flock`` of ``<where>.<n>.lock`` in a per-user directory (``where``: a hash of the endpoint and the
records' location, so only workers writing the same records compete) and holds it for its life, so two workers
write two records (the first keeps the plain ``<host>``, the next ``<host>.2``...), and a restarted
worker takes the lowest free slot again and rewrites its own record rather than adding one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from pathlib import Path

MAX_SIDE_BY_SIDE = 64  # workers of one pool, unindexed, on one host
_HELD: list[int] = []  # the slots' lock fds: held until this process exits


def _lock_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = Path(base) / f"calque-pool-slots-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def host_slot(host: str, records: str, index: int | None) -> str:
    """This worker process's slot on ``host`` among the workers writing load records at ``records``
    (the endpoint and the S3 prefix of the pool's records)."""
    if index is not None:
        return f"{host}-{index}"
    try:
        folder = _lock_dir()
    except OSError:
        return host  # nowhere to lock: the one slot per host of before
    for n in range(MAX_SIDE_BY_SIDE):
        where = hashlib.sha256(records.encode()).hexdigest()[:16]
        fd = os.open(folder / f"{where}.{n}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _HELD.append(fd)
        return host if n == 0 else f"{host}.{n + 1}"
    return f"{host}.{os.getpid()}"  # more side by side than we count: one slot per process
