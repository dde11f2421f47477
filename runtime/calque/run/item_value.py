"""Turning an ItemResult back into what the caller sees: its value, or its exception rebuilt.

A remote exception is raised locally as the same type where that type can be found and built from
its message (builtins, importable exception classes, the script's own classes); otherwise as a
``RemoteError`` carrying the type, the message and the worker's traceback. Either way the worker's
traceback is attached as the exception's cause, so an uncaught one prints both.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import sys
from typing import Any

from calque.aws.store import CLAIM_FAILED
from calque.models import ItemError, ItemResult
from calque.models.values import decode
from calque.warm.loader import SCRIPTS


class RemoteError(Exception):
    """An exception from the pool whose type cannot be rebuilt here."""

    def __init__(self, type_name: str, message: str, traceback: str = "") -> None:
        super().__init__(f"{type_name}: {message}")
        self.type = type_name
        self.message = message
        self.traceback = traceback


class RemoteTraceback(Exception):
    """The worker's traceback, attached as ``__cause__`` of a rebuilt exception."""

    def __init__(self, text: str) -> None:
        super().__init__(text)

    def __str__(self) -> str:
        return f'\n"""\n{self.args[0].rstrip()}\n"""'


def _find_type(name: str) -> type[BaseException] | None:
    script, sep, in_script = name.partition("::")
    if sep:  # the script's own class, named relative to the script by the worker
        found: Any = SCRIPTS.get(script)
        for part in in_script.split("."):
            found = getattr(found, part, None)
        return found if isinstance(found, type) and issubclass(found, Exception) else None
    module_name, _, qual = name.rpartition(".")
    if not module_name:
        found = getattr(builtins, name, None)
    else:
        module = sys.modules.get(module_name)
        if module is None and not module_name.startswith("calque_workload_"):
            try:
                module = importlib.import_module(module_name)
            except Exception:
                return None
        found = module
        for part in qual.split("."):
            found = getattr(found, part, None)
    if isinstance(found, type) and issubclass(found, Exception):
        return found
    return None


def rebuild(error: ItemError) -> BaseException:
    """The exception an ItemError describes, as its own type where possible."""
    exc: BaseException
    cls = _find_type(error.type)
    arg: Any = error.message
    if cls is not None and issubclass(cls, KeyError):
        # str(KeyError(k)) is repr(k): read the key back rather than quote it twice
        with contextlib.suppress(ValueError, SyntaxError):
            arg = ast.literal_eval(error.message)
    try:
        exc = cls(arg) if cls is not None else RemoteError(error.type, error.message, error.traceback)
    except Exception:
        exc = RemoteError(error.type, error.message, error.traceback)
    if error.traceback:
        exc.__cause__ = RemoteTraceback(error.traceback)
    return exc


def value_of(result: ItemResult, return_exceptions: bool = False) -> Any:
    """The result's value; its exception raised (or returned, with ``return_exceptions``)."""
    if result.ok:
        return decode(result.value, "a result")
    assert result.error is not None
    exc = rebuild(result.error)
    if return_exceptions:
        return exc
    raise exc


__all__ = ["CLAIM_FAILED", "RemoteError", "RemoteTraceback", "rebuild", "value_of"]
