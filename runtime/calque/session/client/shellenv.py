"""What ``--shell`` prints for ``eval``: a fixed set of variable names, each value shell-quoted.

The names come from this list, never from the daemon's answer, so not even a fake daemon can make
``eval "$(calque session checkout --shell)"`` run anything: it can only set these variables.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping

EXPORTED_NAMES = (
    "CALQUE_SESSION_ID",
    "CALQUE_SESSION_EXPIRES",
    "CALQUE_SESSION_HOST",
    "CALQUE_SESSION_REF",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
)


def shell_exports(env: Mapping[str, str], warn: Callable[[str], None] = lambda m: None) -> str:
    """``export NAME='value'`` lines for the known names in ``env``; any other name is left out (and
    reported through ``warn``: a newer daemon may know more, this client exports only what it knows)."""
    unknown = sorted(k for k in env if k not in EXPORTED_NAMES)
    if unknown:
        shown = ", ".join(repr(k)[:60] for k in unknown[:5])
        warn(f"not exporting {len(unknown)} variable(s) this client does not know: {shown}")
    return "\n".join(f"export {k}={shlex.quote(str(env[k]))}" for k in EXPORTED_NAMES if k in env)
