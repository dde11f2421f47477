"""What the script's classes and functions are under ``calque run``: proxies whose calls reach a backend.

``Model(dim=8).embed`` and an ``@app.function`` become a ``FunctionProxy`` with Modal's verbs:
``.remote(...)``, ``.map(*iterables, order_outputs=True, return_exceptions=False, kwargs={})``,
``.starmap(iterable, ...)``, ``.for_each(...)``, ``.spawn(...)`` (a ``FunctionCall`` whose
``.get(timeout=)`` waits), ``.local(...)`` (in-process), and ``.aio`` on each for async code.
Arguments travel in ``calque.models.values``' encoding in both backends (so ``--local`` sees what a
pool would see); a value it cannot carry (an object, an array) is refused at the call with a TypeError.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from calque.errors import InfrastructureError
from calque.models import Item, ItemResult
from calque.models.values import encode
from calque.run.backend import Backend, Run, Target
from calque.run.item_value import value_of
from calque.warm.loader import parameter_set
from calque.warm.modal_shim import marks_of

_WAIT_S = 1.0


def _item(target: Target, index: int, args: Iterable[Any], kwargs: dict[str, Any]) -> Item:
    where = f"an argument of {target.label}"
    return Item(index=index, args=encode(list(args), where), kwargs={k: encode(v, where) for k, v in kwargs.items()})


def iter_results(run: Run, order_outputs: bool, return_exceptions: bool) -> Iterator[Any]:
    """Values (or exceptions) as the run's items finish: in input order, or as they land."""
    pending: dict[int, ItemResult] = {}
    nxt = 0
    while True:
        got = run.wait_some(_WAIT_S)
        for r in got:
            if order_outputs:
                pending[r.index] = r
            else:
                yield value_of(r, return_exceptions)
        while nxt in pending:
            yield value_of(pending.pop(nxt), return_exceptions)
            nxt += 1
        if run.finished:  # its last results came with the news: no further wait
            break
    for i in sorted(pending):
        yield value_of(pending[i], return_exceptions)


async def _aiter_of(it: Iterator[Any]) -> AsyncIterator[Any]:
    end = object()
    while True:
        value = await asyncio.to_thread(next, it, end)
        if value is end:
            return
        yield value


def _run_coroutine(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def runner() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=runner)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


class _Verb:
    """A call style with its ``.aio`` twin (``f.remote(...)`` and ``await f.remote.aio(...)``)."""

    def __init__(self, sync: Callable[..., Any], aio: Callable[..., Any]) -> None:
        self._sync, self.aio = sync, aio

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._sync(*args, **kwargs)


def _gather(*calls: FunctionCall) -> list[Any]:
    """``modal.FunctionCall.gather(*calls)``: every call's value, in order; the first failure raises."""
    return [c.get() for c in calls]


async def _gather_aio(*calls: FunctionCall) -> list[Any]:
    return list(await asyncio.gather(*(c.get.aio() for c in calls)))


class FunctionCall:
    """What ``.spawn(...)`` returns: ``.get(timeout=None)`` waits for the value (TimeoutError when it passes).

    ``object_id`` is the pool run's id; ``FunctionCall.from_id(object_id)`` (``modal.FunctionCall``) finds
    the call again, in this process or, on a pool, from another one.
    """

    gather = _Verb(_gather, _gather_aio)

    def __init__(self, run: Run, target: Target) -> None:
        self._run, self._target = run, target
        self._result: ItemResult | None = None
        self.object_id: str = getattr(run, "run_id", f"local-{id(run):x}")
        self.get = _Verb(self._get, self._get_aio)

    def _get(self, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._result is None:
            left = _WAIT_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self._target.label}: no result within {timeout}s (call {self.object_id})")
            got = self._run.wait_some(min(_WAIT_S, left))
            if got:
                self._result = got[0]
            elif self._run.finished:
                raise InfrastructureError(f"{self._target.label}: call {self.object_id} ended without a result")
        return value_of(self._result)

    async def _get_aio(self, timeout: float | None = None) -> Any:
        return await asyncio.to_thread(self._get, timeout)


class FunctionProxy:
    """One remote callable (a method of a class with its parameters, or a function) and its verbs."""

    def __init__(self, dispatcher: Dispatcher, target: Target, fn: Any = None) -> None:
        self._dispatcher, self._target = dispatcher, target
        self.__name__ = target.method
        self.__doc__ = getattr(fn, "__doc__", None)
        self.remote = _Verb(self._remote, self._remote_aio)
        self.map = _Verb(self._map, self._map_aio)
        self.starmap = _Verb(self._starmap, self._starmap_aio)
        self.for_each = _Verb(self._for_each, self._for_each_aio)
        self.spawn = _Verb(self._spawn, self._spawn_aio)
        self.spawn_map = _Verb(self._spawn_map, self._spawn_map_aio)
        self.local = _Verb(self._local, self._local_aio)
        self.remote_gen = _Verb(self._remote_gen, self._remote_gen_aio)
        raw = getattr(fn, "__func__", fn)
        marks = marks_of(fn) if fn is not None else None
        self._is_generator = (
            inspect.isgeneratorfunction(raw)
            or inspect.isasyncgenfunction(raw)
            or bool(marks is not None and marks.options.get("is_generator"))
        )

    def __repr__(self) -> str:
        return f"<calque proxy {self._target.label}>"

    @property
    def _backend(self) -> Backend:
        return self._dispatcher.require_backend()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._local(*args, **kwargs)

    # -- one call ----------------------------------------------------------------------------------

    def _remote(self, *args: Any, **kwargs: Any) -> Any:
        if self._is_generator:
            raise TypeError(f"{self._target.label} is a generator method: call it with .remote_gen(...)")
        run = self._backend.start(self._target, [_item(self._target, 0, args, kwargs)])
        for value in iter_results(run, True, False):
            return value
        raise InfrastructureError(f"{self._target.label}.remote(): the call ended without a result")

    async def _remote_aio(self, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._remote, *args, **kwargs)

    def _remote_gen(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """A generator method's values as its worker produces them (Modal's ``.remote_gen``)."""
        if not self._is_generator:
            raise TypeError(f"{self._target.label} is not a generator method: call it with .remote(...)")
        return self._backend.stream(self._target, _item(self._target, 0, args, kwargs))

    def _remote_gen_aio(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        return _aiter_of(self._remote_gen(*args, **kwargs))

    def _spawn(self, *args: Any, **kwargs: Any) -> FunctionCall:
        if self._is_generator:
            raise TypeError(f"{self._target.label} is a generator method: call it with .remote_gen(...)")
        run = self._backend.start(self._target, [_item(self._target, 0, args, kwargs)])
        run.created()  # its object_id names a call another process can find (FunctionCall.from_id)
        return self._dispatcher.remember(FunctionCall(run, self._target))

    def _spawn_map(self, *iterables: Iterable[Any], kwargs: dict[str, Any] | None = None) -> None:
        """Modal's ``.spawn_map``: returns once every input is sent (on a pool: staged; locally: run)."""
        if self._is_generator:
            raise TypeError(f"{self._target.label} is a generator method: it cannot be called with .spawn_map(...)")
        self._backend.start(self._target, self._items(zip(*iterables, strict=False), kwargs or {})).sent()

    async def _spawn_map_aio(self, *iterables: Iterable[Any], kwargs: dict[str, Any] | None = None) -> None:
        await asyncio.to_thread(self._spawn_map, *iterables, kwargs=kwargs)

    async def _spawn_aio(self, *args: Any, **kwargs: Any) -> FunctionCall:
        return self._spawn(*args, **kwargs)

    def _local(self, *args: Any, **kwargs: Any) -> Any:
        value = self._backend.local_callable(self._target)(*args, **kwargs)
        return _run_coroutine(value) if inspect.iscoroutine(value) else value

    async def _local_aio(self, *args: Any, **kwargs: Any) -> Any:
        value = await asyncio.to_thread(self._backend.local_callable(self._target), *args, **kwargs)
        return (await value) if inspect.iscoroutine(value) else value

    # -- many calls --------------------------------------------------------------------------------

    def _items(self, argsets: Iterable[tuple[Any, ...]], kwargs: dict[str, Any]) -> Iterator[Item]:
        for n, args in enumerate(argsets):
            yield _item(self._target, n, args, kwargs)

    def _map(self, *iterables: Iterable[Any], order_outputs: bool = True, return_exceptions: bool = False,
             kwargs: dict[str, Any] | None = None, wrap_returned_exceptions: bool = True) -> Iterator[Any]:  # fmt: skip
        if not iterables:
            raise TypeError(f"{self._target.label}.map() needs at least one iterable")
        run = self._backend.start(self._target, self._items(zip(*iterables, strict=False), kwargs or {}))
        return iter_results(run, order_outputs, return_exceptions)

    def _starmap(self, input_iterator: Iterable[Iterable[Any]], *, order_outputs: bool = True,
                 return_exceptions: bool = False, kwargs: dict[str, Any] | None = None,
                 wrap_returned_exceptions: bool = True) -> Iterator[Any]:  # fmt: skip
        run = self._backend.start(self._target, self._items((tuple(a) for a in input_iterator), kwargs or {}))
        return iter_results(run, order_outputs, return_exceptions)

    def _for_each(self, *iterables: Iterable[Any], kwargs: dict[str, Any] | None = None,
                  ignore_exceptions: bool = False) -> None:  # fmt: skip
        for _ in self._map(*iterables, kwargs=kwargs, return_exceptions=ignore_exceptions):
            pass

    def _map_aio(self, *iterables: Iterable[Any], **options: Any) -> AsyncIterator[Any]:
        return _aiter_of(self._map(*iterables, **options))

    def _starmap_aio(self, input_iterator: Iterable[Iterable[Any]], **options: Any) -> AsyncIterator[Any]:
        return _aiter_of(self._starmap(input_iterator, **options))

    async def _for_each_aio(self, *iterables: Iterable[Any], **options: Any) -> None:
        await asyncio.to_thread(self._for_each, *iterables, **options)


class ObjProxy:
    """``Model(**parameters)``: its methods are ``FunctionProxy``s; its parameters read as attributes."""

    def __init__(self, cls: ClsProxy, parameters: tuple[tuple[str, Any], ...]) -> None:
        self._cls, self._parameters = cls, parameters
        self._methods: dict[str, FunctionProxy] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        klass = self._cls.klass
        marks = marks_of(inspect.getattr_static(klass, name, None))
        if marks is not None and marks.method:
            if name not in self._methods:
                target = Target(klass.__name__, name, self._parameters)
                self._methods[name] = FunctionProxy(self._cls.dispatcher, target, getattr(klass, name))
            return self._methods[name]
        params = dict(self._parameters)
        if name in params:
            return params[name]
        raise AttributeError(
            f"{klass.__name__} has no @modal.method() {name!r} to call from the local entrypoint "
            "(only methods run remotely; other attributes live on the pool's instance)"
        )


class ClsProxy:
    """An ``@app.cls`` class under ``calque run``: calling it gives an ``ObjProxy``."""

    def __init__(self, dispatcher: Dispatcher, klass: type) -> None:
        self.dispatcher, self.klass = dispatcher, klass
        self.__name__ = klass.__name__
        self.__doc__ = klass.__doc__

    def __call__(self, *args: Any, **parameters: Any) -> ObjProxy:
        name = self.klass.__name__
        if args:
            raise TypeError(f"{name}(...) takes its modal.parameter() values by keyword")
        pset = parameter_set(self.klass)
        unknown = sorted(set(parameters) - set(pset.defaults) - set(pset.required))
        if unknown and pset.declared:
            raise TypeError(
                f"{name}() got unknown parameter(s) {unknown} (it declares {sorted(pset.defaults) + pset.required})"
            )
        missing = [k for k in pset.required if k not in parameters]
        if missing:
            raise TypeError(f"{name}() needs parameter(s) {missing}: modal.parameter() without a default")
        # the full set, defaults included: what a worker builds, and what a pool's set is compared with
        return ObjProxy(self, tuple(sorted({**pset.defaults, **parameters}.items())))

    def with_options(self, **_: Any) -> ClsProxy:
        return self  # GPUs, memory and scaling are the pool's, not the caller's

    with_concurrency = with_batching = with_options

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self(), name)  # the pre-1.0 spelling Model.method.remote(...)


class DeployedCls:
    """``modal.Cls.from_name(pool, "Model")``: a class served by a deployed pool; its code is the pool's."""

    def __init__(self, dispatcher: Dispatcher, pool: str, name: str) -> None:
        self._dispatcher, self._pool, self.__name__ = dispatcher, pool, name

    def __call__(self, *args: Any, **parameters: Any) -> DeployedObj:
        if args:
            raise TypeError(f"{self.__name__}(...) takes its modal.parameter() values by keyword")
        return DeployedObj(self, tuple(sorted(parameters.items())))

    def with_options(self, **_: Any) -> DeployedCls:
        return self


class DeployedObj:
    """``Cls.from_name(...)(**parameters)``: any method name; the pool's workers say which they serve."""

    def __init__(self, cls: DeployedCls, parameters: tuple[tuple[str, Any], ...]) -> None:
        self._cls, self._parameters = cls, parameters

    def __getattr__(self, name: str) -> FunctionProxy:
        if name.startswith("__"):
            raise AttributeError(name)
        target = Target(self._cls.__name__, name, self._parameters, deployed=self._cls._pool)
        return FunctionProxy(self._cls._dispatcher, target)


class Dispatcher:
    """The shim's ``_CLIENT`` under ``calque run``: makes proxies; holds the backend they call."""

    def __init__(self) -> None:
        self.backend: Backend | None = None
        self._calls: dict[str, FunctionCall] = {}
        self._calls_lock = threading.Lock()

    def remember(self, call: FunctionCall) -> FunctionCall:
        with self._calls_lock:
            self._calls[call.object_id] = call
        return call

    def call_from_id(self, call_id: str) -> FunctionCall:
        """``modal.FunctionCall.from_id``: a call spawned in this run, else a pool's run of that id."""
        with self._calls_lock:
            known = self._calls.get(call_id)
        if known is not None:
            return known
        run, target = self.require_backend().adopt(call_id)
        return self.remember(FunctionCall(run, target))

    def require_backend(self) -> Backend:
        if self.backend is None:
            raise RuntimeError("a remote call ran while the script was being imported; call it from the entrypoint")
        return self.backend

    def deployed(self, kind: str, pool: str, name: str) -> DeployedCls | FunctionProxy:
        """``Cls.from_name``/``Function.from_name``: resolved on first call (scripts look up at import)."""
        if kind == "Cls":
            return DeployedCls(self, pool, name)
        return FunctionProxy(self, Target(name, name, (), is_function=True, deployed=pool))

    def cls_proxy(self, klass: type) -> ClsProxy:
        return ClsProxy(self, klass)

    def function_proxy(self, fn: Callable[..., Any]) -> FunctionProxy:
        return FunctionProxy(self, Target(fn.__name__, fn.__name__, (), is_function=True), fn)
