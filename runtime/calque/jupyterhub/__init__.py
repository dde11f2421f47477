"""calque's JupyterHub spawner (issue 36): a researcher's notebook server on a slice the institution's
broker grants her, started as her inside the session's cgroup on the slice's host.

``CalqueSpawner`` (the ``jupyterhub.spawners`` entry point ``calque``) needs the ``notebooks`` extra
(JupyterHub); it is imported on first use, so ``calque`` itself never pulls JupyterHub in. What the
spawner asks of the broker and the hosts is ``slices.py``'s, which needs nothing beyond calque.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "CalqueSpawner":
        from calque.jupyterhub.spawner import CalqueSpawner

        return CalqueSpawner
    raise AttributeError(name)
