"""calque's stand-in ``modal`` module: what a Modal-shaped script sees when it runs on a calque worker.

It is put in place only inside a worker process, as ``sys.modules["modal"]``, right before the
script is imported (see ``calque.warm.loader``); it is never installed as a top-level ``modal``
package, so the real Modal client keeps working for every other program on the machine.

The decorators record what the script declared (lifecycle hooks, methods, batching, concurrency,
parameters) on the decorated objects; ``calque.warm.loader`` reads those marks back. Things that
only matter on Modal's own cloud (images, secrets, volumes, GPUs, schedules) are inert values
(``calque.warm.modal_inert``).
Anything the worker cannot honour raises ``ShimError`` naming the construct, so the loader can
refuse the script at load with the script's line instead of failing silently later.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from calque.warm.calls import FunctionCall as FunctionCall  # modal.FunctionCall
from calque.warm.calls import in_remote_thread
from calque.warm.dispatch import DISPATCH
from calque.warm.dispatch import ShimError as ShimError  # modal-shaped errors the worker raises
from calque.warm.modal_inert import CloudBucketMount as CloudBucketMount  # modal.<name>: cloud-only, inert
from calque.warm.modal_inert import Cls as Cls
from calque.warm.modal_inert import Cron as Cron
from calque.warm.modal_inert import Dict as Dict
from calque.warm.modal_inert import Function as Function
from calque.warm.modal_inert import Image as Image
from calque.warm.modal_inert import Mount as Mount
from calque.warm.modal_inert import NetworkFileSystem as NetworkFileSystem
from calque.warm.modal_inert import Period as Period
from calque.warm.modal_inert import Queue as Queue
from calque.warm.modal_inert import Retries as Retries
from calque.warm.modal_inert import Secret as Secret
from calque.warm.modal_inert import Volume as Volume
from calque.warm.modal_inert import config as config
from calque.warm.modal_inert import current_function_call_id as current_function_call_id
from calque.warm.modal_inert import current_input_id as current_input_id
from calque.warm.modal_inert import gpu as gpu
from calque.warm.modal_inert import script_line

__calque_shim__ = True


# -- options the decorators accept -------------------------------------------------------------

# Keyword arguments of @app.function / @app.cls across Modal's API eras (0.5x .. 1.x). Accepted and
# recorded; the host (not the script) decides GPUs, memory and scaling on calque.
_FUNCTION_KWARGS = frozenset(
    {
        # current era
        "image", "secrets", "gpu", "cpu", "memory", "timeout", "retries", "volumes", "cloud", "region",
        "min_containers", "max_containers", "buffer_containers", "scaledown_window", "enable_memory_snapshot",
        "experimental_options", "serialized", "ephemeral_disk", "proxy", "name", "schedule", "include_source",
        "single_use_containers", "max_inputs", "restrict_modal_access", "i6pn", "block_network", "env",
        "network_file_systems", "cloud_bucket_mounts", "startup_timeout", "nonpreemptible", "rdma",
        # older era
        "keep_warm", "container_idle_timeout", "allow_concurrent_inputs", "concurrency_limit", "secret",
        "mounts", "checkpointing_enabled", "interactive", "is_generator", "allow_cross_region_volumes",
        "_allow_background_volume_commits", "_experimental_boost", "_experimental_scheduler_placement",
        "_experimental_gpus", "_experimental_proxy_ip", "_experimental_buffer_containers",
        "_experimental_custom_scaling_factor", "_experimental_restrict_output",
    }
)  # fmt: skip


def _check_kwargs(construct: str, kwargs: dict[str, Any]) -> None:
    unknown = sorted(set(kwargs) - _FUNCTION_KWARGS)
    if unknown:
        raise ShimError(
            f"{construct} got keyword argument(s) {', '.join(unknown)} that the calque worker does not know"
        )


@dataclass
class Marks:
    """What the decorators recorded on one function (stored as ``fn.__calque_marks__``)."""

    method: bool = False
    enter: bool = False
    snap: bool = False
    exit: bool = False
    build: bool = False
    batched: tuple[int, int] | None = None  # (max_batch_size, wait_ms)
    concurrent: int | None = None
    web: bool = False
    options: dict[str, Any] = field(default_factory=dict)


def _marks(fn: Any) -> Marks:
    target = fn
    m: Marks | None = getattr(target, "__calque_marks__", None)
    if m is None:
        m = Marks()
        target.__calque_marks__ = m
    return m


def marks_of(obj: Any) -> Marks | None:
    raw = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
    m: Marks | None = getattr(raw, "__calque_marks__", None)
    return m


def _decorator(apply: Callable[[Marks], None], args: tuple[Any, ...], name: str) -> Any:
    """Support both ``@modal.x()`` and the bare ``@modal.x`` spelling."""

    def wrap(fn: Any) -> Any:
        if not callable(fn):
            raise ShimError(f"@modal.{name} decorates a function, got {type(fn).__name__}")
        apply(_marks(fn))
        return fn

    if len(args) == 1 and callable(args[0]):
        return wrap(args[0])
    if args:
        raise ShimError(f"@modal.{name} takes keyword arguments only")
    return wrap


def method(*args: Any, **kwargs: Any) -> Any:
    """``@modal.method()``: a method a claim may name."""

    def apply(m: Marks) -> None:
        m.method = True
        m.options.update(kwargs)

    return _decorator(apply, args, "method")


def enter(*args: Any, snap: bool = False, **_: Any) -> Any:
    """``@modal.enter(snap=...)``: run once when the worker starts (snap=True ones first)."""

    def apply(m: Marks) -> None:
        m.enter = True
        m.snap = bool(snap)

    return _decorator(apply, args, "enter")


def exit(*args: Any, **_: Any) -> Any:
    """``@modal.exit()``: run once when the worker shuts down."""

    def apply(m: Marks) -> None:
        m.exit = True

    return _decorator(apply, args, "exit")


def build(*args: Any, **_: Any) -> Any:
    """``@modal.build()`` (older era): there is no image build step, so it runs once before ``@enter``."""

    def apply(m: Marks) -> None:
        m.build = True

    return _decorator(apply, args, "build")


def batched(*args: Any, max_batch_size: int = 1, wait_ms: int = 0, **_: Any) -> Any:
    """``@modal.batched(max_batch_size=, wait_ms=)``: the method takes and returns lists of equal length."""
    if not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ShimError(f"@modal.batched(max_batch_size={max_batch_size!r}) needs a positive integer")

    def apply(m: Marks) -> None:
        m.method = True
        m.batched = (max_batch_size, int(wait_ms))

    return _decorator(apply, args, "batched")


def concurrent(*args: Any, max_inputs: int = 1, target_inputs: int | None = None, **_: Any) -> Any:
    """``@modal.concurrent(max_inputs=)``: on a class or a function; up to ``max_inputs`` items at once."""
    if not isinstance(max_inputs, int) or max_inputs < 1:
        raise ShimError(f"@modal.concurrent(max_inputs={max_inputs!r}) needs a positive integer")

    def wrap(obj: Any) -> Any:
        obj.__calque_concurrent__ = max_inputs
        return obj

    if len(args) == 1 and callable(args[0]):
        return wrap(args[0])
    return wrap


def _web(name: str) -> Callable[..., Any]:
    def deco(*args: Any, **_: Any) -> Any:
        def apply(m: Marks) -> None:
            m.web = True

        return _decorator(apply, args, name)

    return deco


web_endpoint = _web("web_endpoint")
fastapi_endpoint = _web("fastapi_endpoint")
asgi_app = _web("asgi_app")
wsgi_app = _web("wsgi_app")
web_server = _web("web_server")


class _Parameter:
    """The value ``modal.parameter()`` leaves on the class; the loader replaces it per instance."""

    _NO_DEFAULT = object()

    def __init__(self, default: Any, init: bool) -> None:
        self.default = default
        self.init = init

    @property
    def has_default(self) -> bool:
        return self.default is not _Parameter._NO_DEFAULT

    def __repr__(self) -> str:
        return f"modal.parameter(default={self.default!r})" if self.has_default else "modal.parameter()"


def parameter(*, default: Any = _Parameter._NO_DEFAULT, init: bool = True) -> Any:
    """``name: str = modal.parameter(default=...)``: set per pool from the spec's ``parameters``."""
    return _Parameter(default, init)


# -- the App ------------------------------------------------------------------------------------


class App:
    """``modal.App(...)``: records the classes and functions the script registers."""

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        self.name = name
        self.options = kwargs
        self.registered_classes: dict[str, type] = {}
        self.registered_functions: dict[str, Callable[..., Any]] = {}
        self.entrypoints: list[Callable[..., Any]] = []
        DECLARED_APPS.append(self)

    def cls(self, *args: Any, **kwargs: Any) -> Callable[[type], type]:
        if args:
            raise ShimError("@app.cls takes keyword arguments only: write @app.cls(...)")
        _check_kwargs("@app.cls", kwargs)
        where = script_line()

        def wrap(klass: type) -> type:
            if not inspect.isclass(klass):
                raise ShimError(f"@app.cls decorates a class, got {type(klass).__name__} ({where})")
            klass.__calque_cls__ = dict(kwargs)  # type: ignore[attr-defined]
            klass.__calque_line__ = where  # type: ignore[attr-defined]
            self.registered_classes[klass.__name__] = klass
            if DISPATCH.client is not None:
                return DISPATCH.client.cls_proxy(klass)  # type: ignore[no-any-return]
            return klass

        return wrap

    def function(self, *args: Any, **kwargs: Any) -> Any:
        _check_kwargs("@app.function", kwargs)

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            fn.__calque_function__ = dict(kwargs)  # type: ignore[attr-defined]
            self.registered_functions[fn.__name__] = fn
            if DISPATCH.client is not None:
                return DISPATCH.client.function_proxy(fn)  # type: ignore[no-any-return]
            return fn

        if len(args) == 1 and callable(args[0]):
            return wrap(args[0])
        return wrap

    def local_entrypoint(self, *args: Any, **_: Any) -> Any:
        """Recorded; never run by the worker, run by ``calque run`` (the submitter's side of a Modal script)."""

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.entrypoints.append(fn)
            return fn

        if len(args) == 1 and callable(args[0]):
            return wrap(args[0])
        return wrap

    def include(self, other: App) -> App:
        self.registered_classes.update(other.registered_classes)
        self.registered_functions.update(other.registered_functions)
        return self

    @contextlib.contextmanager
    def run(self, *_: Any, **__: Any) -> Iterator[App]:
        yield self


Stub = App  # the pre-0.57 name
DECLARED_APPS: list[App] = []  # every App the loaded script made (read by warm.loader and calque run)


def is_local() -> bool:
    """False on a calque worker and in remote code (the script runs 'remotely', as inside a Modal
    container); True in ``calque run``'s local entrypoint and ``.local()`` calls."""
    return DISPATCH.client is not None and not in_remote_thread()


def __getattr__(name: str) -> Any:
    # Anything else of Modal's API: refuse at load, naming it and the script's line.
    if name.startswith("__"):
        raise AttributeError(name)
    raise ShimError(f"modal.{name} is not supported by the calque worker ({script_line()})")
