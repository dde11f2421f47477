"""The inert half of calque's stand-in ``modal`` module (``modal_shim.py`` re-exports every name here).

Things that only matter on Modal's own cloud (images, secrets, volumes, GPUs, schedules, deployed
functions outside ``calque run``) are values a script may declare and pass to a decorator; using one
for real raises ``ShimError`` naming the construct and the script's line.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from calque.warm.calls import deployed
from calque.warm.dispatch import ShimError

__calque_shim__ = True  # script_line() steps over this module's frames, as over modal_shim's


def script_line() -> str:
    """'file.py line N' of the first frame outside the shim's modules (the script's line)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__calque_shim__"):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "unknown line"
    return f"{os.path.basename(frame.f_code.co_filename)} line {frame.f_lineno}"


class _ChainMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: cls()


class Image(metaclass=_ChainMeta):
    """``modal.Image``: every constructor and chain step returns an inert image."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: self

    @contextlib.contextmanager
    def imports(self) -> Iterator[None]:
        # Inside a container Modal lets an ImportError here propagate; so does the worker, and the
        # loader reports it with the module name and the script's line.
        yield


class _Inert(metaclass=_ChainMeta):
    """A Modal object that is fine to reference (declare, pass to a decorator) but not to use."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        kind = type(self).__name__

        def refuse(*_: Any, **__: Any) -> Any:
            raise ShimError(f"modal.{kind}.{name}() is not available on a calque worker ({script_line()})")

        return refuse

    def __getitem__(self, key: Any) -> Any:
        raise ShimError(f"modal.{type(self).__name__} is not available on a calque worker ({script_line()})")

    __setitem__ = __getitem__


class Secret(_Inert):
    pass


class Dict(_Inert):
    pass


class Queue(_Inert):
    pass


class Mount(_Inert):
    pass


class NetworkFileSystem(_Inert):
    pass


class CloudBucketMount(_Inert):
    def __init__(self, *_: Any, **__: Any) -> None:
        pass


class Volume(_Inert):
    """Volume.commit()/reload() are no-ops: a worker's files stay on the host's disk."""

    def commit(self) -> None:
        return None

    def reload(self) -> None:
        return None


class Retries:
    def __init__(self, *_: Any, **__: Any) -> None:
        pass


class Cron:
    def __init__(self, *_: Any, **__: Any) -> None:
        pass


class Period:
    def __init__(self, *_: Any, **__: Any) -> None:
        pass


class _Gpu:
    def __init__(self, *_: Any, **__: Any) -> None:
        pass


class _GpuNamespace:
    """``modal.gpu.A100(...)`` (older era): inert GPU requests."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Gpu


gpu = _GpuNamespace()


class Function(_Inert):
    """``Function.from_name(app, name)``: a deployed pool's function under ``calque run``; not on a worker."""

    from_name = staticmethod(lambda app_name, name, **_: deployed("Function", app_name, name) or Function())


class Cls(_Inert):
    from_name = staticmethod(lambda app_name, name, **_: deployed("Cls", app_name, name) or Cls())


class _Config:
    def get(self, key: str, default: Any = None) -> Any:
        return default

    def __getitem__(self, key: str) -> Any:
        return None


config = _Config()


def current_input_id() -> str | None:
    return None


def current_function_call_id() -> str | None:
    return None
