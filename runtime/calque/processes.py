"""Whether a process still runs, asked with signal 0: for the GPU's forced stop (``gpu/stopping.py``)
and a worker's marker of a sibling (``pool/worker/instance.py``)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists, another user's included (we may not signal it, but it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
