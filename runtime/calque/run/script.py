"""Run a script's local entrypoint: import it with the stand-in ``modal``, route its calls, report.

The stand-in is put in ``sys.modules["modal"]`` for this process only (never installed), with a
``Dispatcher`` as its client, so ``@app.cls`` classes and ``@app.function``s of the script become
proxies whose calls go to pools (``PoolBackend``) or, with ``local=True``, run in this process
(``LocalBackend``). The entrypoint's arguments are parsed from its signature (``calque.run.args``).
"""

from __future__ import annotations

import asyncio
import inspect
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calque.errors import CalqueError, UsageError
from calque.run.args import parse_entrypoint_args
from calque.run.local_backend import LocalBackend
from calque.run.pool_backend import PoolBackend
from calque.run.pool_mapping import PoolMap
from calque.run.progress import Tally
from calque.run.proxies import Dispatcher
from calque.warm import modal_shim
from calque.warm.dispatch import DISPATCH
from calque.warm.loader import import_script


class EntrypointError(CalqueError):
    """The local entrypoint raised: exit 1, with its exception and traceback (the worker's too)."""

    exit_code = 1


@dataclass
class RunOutcome:
    """What the entrypoint returned, and what its calls did."""

    value: Any
    tally: Tally
    where: str


def _entrypoint(path: Path, name: str | None) -> Any:
    entrypoints = {fn.__name__: fn for app in modal_shim.DECLARED_APPS for fn in app.entrypoints}
    if name:
        if name not in entrypoints:
            raise UsageError(
                f"{path.name} has no @app.local_entrypoint() named {name!r} "
                f"(it has: {', '.join(sorted(entrypoints)) or 'none'})"
            )
        return entrypoints[name]
    if len(entrypoints) == 1:
        return next(iter(entrypoints.values()))
    if not entrypoints:
        raise UsageError(
            f"{path.name} has no @app.local_entrypoint(): calque run runs a script's local entrypoint "
            "(to send items to a pool without one, use calque pool submit)"
        )
    raise UsageError(f"{path.name} has several local entrypoints {sorted(entrypoints)}: name one as {path.name}::NAME")


def run_script(
    script: str,
    args: list[str],
    *,
    local: bool = False,
    pool: str | None = None,
    pools_file: str | None = None,
    timeout_s: float = 3600.0,
) -> RunOutcome:
    """Import ``script`` (``path.py[::entrypoint]``), run its local entrypoint with ``args``; its outcome."""
    path_text, _, name = script.partition("::")
    path = Path(path_text).resolve()
    dispatcher = Dispatcher()
    previous = DISPATCH.client
    DISPATCH.client = dispatcher
    tally = Tally()
    try:
        module = import_script(path)
        fn = _entrypoint(path, name or None)
        positional, keywords = parse_entrypoint_args(fn, args)
        in_process = LocalBackend(module, path, tally)
        backend: LocalBackend | PoolBackend = in_process
        if not local:
            pools = PoolMap(path, pool, pools_file)
            backend = PoolBackend(pools, tally, timeout_s=timeout_s, local=in_process)
        dispatcher.backend = backend
        tally.start_progress()
        try:
            value = fn(*positional, **keywords)
            if inspect.iscoroutine(value):
                value = asyncio.run(value)
        except CalqueError:
            raise
        except Exception as exc:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
            raise EntrypointError(
                f"the local entrypoint {fn.__name__} raised {type(exc).__name__}: {exc}\n{text}"
            ) from exc
        finally:
            tally.stop_progress()
            backend.close()
        return RunOutcome(value, tally, backend.describe())
    finally:
        DISPATCH.client = previous
