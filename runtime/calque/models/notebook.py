"""Contracts of the ``notebook`` request: the host daemon starts the single-user notebook server as the
session's user inside the session's cgroup (``session/daemon/notebook.py``; issue 36).

The request names a session and nothing to run: the command is the host's (``notebook_command`` in
``session.yaml``). What the hub may pass is the environment its single-user server needs to find the
hub and prove itself (``JUPYTERHUB_*`` and ``JPY_API_TOKEN``); any other name is refused, so no
request sets ``PATH``, ``LD_PRELOAD`` or ``PYTHONPATH`` for the server.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import ConfigDict, Field, StrictInt, StrictStr, field_validator

from calque.models.base import CalqueModel
from calque.models.session_args import SessionRefArgs

_DEFERRED = ConfigDict(defer_build=True)

HUB_ENV_NAME = re.compile(r"^(JUPYTERHUB_[A-Z0-9_]{1,64}|JPY_API_TOKEN)$")
MAX_HUB_ENV = 48


class NotebookArgs(SessionRefArgs):
    """``notebook``: start the host's single-user server in the session, with the hub's variables."""

    model_config = _DEFERRED

    env: dict[StrictStr, Annotated[StrictStr, Field(max_length=4096)]] = Field(
        default_factory=dict, description="the hub's JUPYTERHUB_* variables for the server (no other name)"
    )

    @field_validator("env")
    @classmethod
    def _hub_names_only(cls, env: dict[str, str]) -> dict[str, str]:
        if len(env) > MAX_HUB_ENV:
            raise ValueError(f"at most {MAX_HUB_ENV} variables")
        bad = sorted(k for k in env if not HUB_ENV_NAME.match(k))
        if bad:
            raise ValueError(
                f"only the hub's JUPYTERHUB_* variables (and JPY_API_TOKEN) may be passed; refused: {', '.join(bad)}"
            )
        nul = sorted(k for k, v in env.items() if "\0" in v)
        if nul:
            raise ValueError(f"a NUL byte in {', '.join(nul)}")
        return env


class NotebookStarted(CalqueModel):
    """``notebook``'s answer: where the server listens (the hub's proxy routes there) and its process."""

    model_config = _DEFERRED

    session_id: str
    user: str
    ip: str
    port: Annotated[StrictInt, Field(ge=1, le=65535)]
    pid: int
    log: str = Field(description="the server's log, in the user's home (or /dev/null without one)")
