"""Load a Modal-shaped script on a worker: put the stand-in ``modal`` in place, import, read the marks.

``load_workload("path/to/script.py::Model", parameters)`` returns a ``Workload``: the target (a class
built the way Modal builds it, or the script's ``@app.function``s), its lifecycle hooks in Modal's
order, its methods with their batching and concurrency, and the ``workload_digest``. Every problem
(an ImportError under ``image.imports()``, a Modal construct the worker cannot honour, a missing
parameter, a method both batched and a generator) becomes a ``WorkloadError`` naming the construct and the
script's line, at load, never later.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import os
import sys
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calque.errors import UsageError
from calque.warm import modal_shim
from calque.warm.modal_shim import Marks, marks_of


class WorkloadError(UsageError):
    """The script cannot run on a calque worker; the message names the construct and the line."""


@dataclass(frozen=True)
class MethodInfo:
    """One callable a claim may name."""

    name: str
    fn: Any  # bound method or function
    is_async: bool
    batched: tuple[int, int] | None = None  # (max_batch_size, wait_ms)
    is_generator: bool = False  # yields: its values stream (``calque.warm.streaming``)


@dataclass
class Workload:
    """A loaded script: the instance (or module) and what the worker does with it."""

    path: Path
    target_name: str
    instance: Any
    methods: dict[str, MethodInfo]
    build: list[Any] = field(default_factory=list)
    enter_snap: list[Any] = field(default_factory=list)
    enter: list[Any] = field(default_factory=list)
    exit: list[Any] = field(default_factory=list)
    max_inputs: int = 1
    digest: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    module_name: str = ""  # what the script was imported as (its exception classes' ``__module__``)


# The scripts this process imported, by file name: where a caller looks up an exception class that a
# worker named relative to its script (``script.py::QuotaExceeded``, ``calque.run.item_value``).
SCRIPTS: dict[str, types.ModuleType] = {}


def workload_digest(script: bytes, target: str, parameters: dict[str, Any]) -> str:
    """sha256 over the script's bytes, the target name and the pool's parameter values."""
    h = hashlib.sha256()
    h.update(script)
    h.update(b"\0" + target.encode())
    h.update(b"\0" + json.dumps(parameters, sort_keys=True, default=str).encode())
    return "sha256:" + h.hexdigest()


def split_workload(workload: str) -> tuple[Path, str | None]:
    path, _, name = workload.partition("::")
    return Path(path), (name or None)


def _script_line(exc: BaseException, path: Path) -> str:
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if os.path.abspath(frame.filename) == str(path):
            return f"{path.name} line {frame.lineno}"
    return path.name


def _import_script(path: Path) -> types.ModuleType:
    # The stand-in modal exists only in this process, only from here on.
    sys.modules["modal"] = modal_shim
    modal_shim.DECLARED_APPS.clear()
    mod_name = f"calque_workload_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise WorkloadError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    SCRIPTS[path.name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        if (exc.name or "").startswith("modal."):
            raise WorkloadError(
                f"{_script_line(exc, path)}: {exc.name} is not supported by the calque worker "
                "(only the top-level modal API is)"
            ) from exc
        raise WorkloadError(
            f"{_script_line(exc, path)}: import of {exc.name or exc} failed on this worker ({exc}). "
            "Install it on the host (imports under image.imports() run on the worker, as in a Modal container)."
        ) from exc
    except modal_shim.ShimError as exc:
        raise WorkloadError(f"{_script_line(exc, path)}: {exc}") from exc
    except Exception as exc:
        raise WorkloadError(
            f"{_script_line(exc, path)}: loading the script raised {type(exc).__name__}: {exc}"
        ) from exc
    return module


def _pick_target(module: types.ModuleType, path: Path, name: str | None) -> tuple[str, type | None]:
    classes: dict[str, type] = {}
    functions: dict[str, Any] = {}
    for app in modal_shim.DECLARED_APPS:
        classes.update(app.registered_classes)
        functions.update(app.registered_functions)
    if name is not None:
        if name in classes:
            return name, classes[name]
        obj = getattr(module, name, None)
        if inspect.isclass(obj):
            raise WorkloadError(f"{path.name}: class {name} has no @app.cls(...) decorator")
        if name in functions:
            return name, None
        raise WorkloadError(
            f"{path.name}: no @app.cls class or @app.function named {name!r} "
            f"(classes: {sorted(classes) or 'none'}, functions: {sorted(functions) or 'none'})"
        )
    if len(classes) == 1:
        only = next(iter(classes))
        return only, classes[only]
    if len(classes) > 1:
        raise WorkloadError(f"{path.name} has several classes {sorted(classes)}: name one as {path}::Class")
    if functions:
        return "functions", None
    raise WorkloadError(f"{path.name} registers no @app.cls class and no @app.function")


def _coerce(value: Any, annotation: Any, cls_name: str, pname: str) -> Any:
    ann = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    try:
        if ann == "int":
            return int(value)
        if ann == "float":
            return float(value)
        if ann == "bool":
            if isinstance(value, str):
                return value.strip().lower() in ("1", "true", "yes", "on")
            return bool(value)
        if ann == "str":
            return str(value)
        if ann == "bytes":
            return value.encode() if isinstance(value, str) else bytes(value)
    except (TypeError, ValueError) as exc:
        raise WorkloadError(f"parameter {cls_name}.{pname}: {value!r} is not a valid {ann}") from exc
    return value


@dataclass(frozen=True)
class ParameterSet:
    """A class's parameters as Modal reads them: ``modal.parameter()`` fields, or a pre-1.0 ``__init__``."""

    defaults: dict[str, Any]  # every parameter that has a default, with it
    required: list[str]  # those without one
    annotations: dict[str, Any]
    declared: bool  # modal.parameter() fields (names are checked); False: a constructor's keywords


def _declared_parameters(klass: type) -> tuple[dict[str, modal_shim._Parameter], dict[str, Any]]:
    """The class's ``modal.parameter()`` fields and its annotations, bases first (a subclass wins)."""
    declared: dict[str, modal_shim._Parameter] = {}
    annotations: dict[str, Any] = {}
    for base in reversed(klass.__mro__):
        annotations.update(getattr(base, "__annotations__", {}))
        for k, v in vars(base).items():
            if isinstance(v, modal_shim._Parameter):
                declared[k] = v
    return declared, annotations


def parameter_set(klass: type) -> ParameterSet:
    """What ``klass(**kw)`` takes; a call's full set is ``{**defaults, **kw}`` (what a worker builds)."""
    declared, annotations = _declared_parameters(klass)
    if declared:
        return ParameterSet(
            {k: p.default for k, p in declared.items() if p.has_default},
            [k for k, p in declared.items() if not p.has_default],
            annotations,
            True,
        )
    init = next((vars(b)["__init__"] for b in klass.__mro__ if b is not object and "__init__" in vars(b)), None)
    if init is None:
        return ParameterSet({}, [], annotations, True)
    params = [
        p
        for p in list(inspect.signature(init).parameters.values())[1:]
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return ParameterSet(
        {p.name: p.default for p in params if p.default is not p.empty},
        [p.name for p in params if p.default is p.empty],
        annotations,
        False,
    )


def coerce_parameter(value: Any, annotation: Any, cls_name: str, pname: str) -> Any:
    """A pool spec's parameter value as the class's annotation reads it (a YAML string for an int field)."""
    return _coerce(value, annotation, cls_name, pname)


def _instantiate(klass: type, parameters: dict[str, Any], path: Path) -> Any:
    """Build the instance as Modal does: ``__init__`` is not called; parameters are set as fields."""
    declared, annotations = _declared_parameters(klass)
    has_own_init = any("__init__" in vars(b) for b in klass.__mro__ if b is not object)
    if not declared and has_own_init:
        # Pre-1.0 style: a constructor with arguments; the pool's parameters are its keywords.
        try:
            return klass(**parameters)
        except Exception as exc:
            raise WorkloadError(
                f"{_script_line(exc, path)}: {klass.__name__}(**parameters) raised {type(exc).__name__}: {exc}"
            ) from exc
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise WorkloadError(
            f"the pool sets parameter(s) {unknown} that {klass.__name__} does not declare with modal.parameter() "
            f"(declared: {sorted(declared) or 'none'})"
        )
    obj: Any = object.__new__(klass)
    for pname, p in declared.items():
        if pname in parameters:
            value = _coerce(parameters[pname], annotations.get(pname), klass.__name__, pname)
        elif p.has_default:
            value = p.default
        else:
            raise WorkloadError(
                f"{klass.__name__}.{pname} = modal.parameter() has no default: set it in the pool spec's parameters"
            )
        object.__setattr__(obj, pname, value)
    return obj


def _collect(klass: type) -> dict[str, Marks]:
    """Marked attributes in definition order, base classes first (an override keeps its place)."""
    found: dict[str, Marks] = {}
    for base in reversed(klass.__mro__):
        if base is object:
            continue
        for k, v in vars(base).items():
            m = marks_of(v)
            if m is not None:
                found[k] = m
            elif k in found:
                del found[k]  # overridden by an unmarked attribute
    return found


def _method_info(name: str, fn: Any, marks: Marks | None, where: str) -> MethodInfo:
    raw = getattr(fn, "__func__", fn)
    is_async_gen = inspect.isasyncgenfunction(raw)
    is_generator = inspect.isgeneratorfunction(raw) or is_async_gen or bool(marks and marks.options.get("is_generator"))
    batched = marks.batched if marks else None
    if is_generator and batched is not None:
        raise WorkloadError(f"{where}: method {name} is both batched and a generator; make it one or the other")
    return MethodInfo(
        name=name,
        fn=fn,
        is_async=inspect.iscoroutinefunction(raw) or is_async_gen,
        batched=batched,
        is_generator=is_generator,
    )


def _class_workload(klass: type, path: Path, parameters: dict[str, Any]) -> Workload:
    where = getattr(klass, "__calque_line__", path.name)
    opts: dict[str, Any] = getattr(klass, "__calque_cls__", {})
    instance = _instantiate(klass, parameters, path)
    marked = _collect(klass)
    w = Workload(path=path, target_name=klass.__name__, instance=instance, methods={})
    for name, m in marked.items():
        if m.web:
            continue
        bound = getattr(instance, name)
        if m.method:
            w.methods[name] = _method_info(name, bound, m, f"{path.name} {klass.__name__}")
        if m.build:
            w.build.append(bound)
        if m.enter and m.snap:
            w.enter_snap.append(bound)
        if m.exit:
            w.exit.append(bound)
    # Modal's order after a snapshot: legacy dunders first, then @enter() methods.
    for dunder in ("__enter__", "__aenter__"):
        if hasattr(klass, dunder):
            w.enter.append(getattr(instance, dunder))
    w.enter += [getattr(instance, n) for n, m in marked.items() if m.enter and not m.snap]
    for dunder in ("__exit__", "__aexit__"):
        if hasattr(klass, dunder):
            bound = getattr(instance, dunder)
            w.exit.insert(0, _dunder_exit(bound))
    if not w.methods:
        raise WorkloadError(f"{where}: class {klass.__name__} has no @modal.method() or @modal.batched() method")
    concurrency = getattr(klass, "__calque_concurrent__", None) or opts.get("allow_concurrent_inputs") or 1
    w.max_inputs = int(concurrency)
    return w


def _dunder_exit(bound: Any) -> Any:
    if inspect.iscoroutinefunction(bound):

        async def aexit() -> Any:
            return await bound(None, None, None)

        return aexit

    def sync_exit() -> Any:
        return bound(None, None, None)

    return sync_exit


def _function_workload(path: Path, name: str, parameters: dict[str, Any]) -> Workload:
    if parameters:
        raise WorkloadError(f"{path.name}: pool parameters {sorted(parameters)} need an @app.cls class")
    functions: dict[str, Any] = {}
    for app in modal_shim.DECLARED_APPS:
        functions.update(app.registered_functions)
    if name != "functions":
        functions = {name: functions[name]}
    w = Workload(path=path, target_name=name, instance=None, methods={})
    for fname, fn in functions.items():
        m = marks_of(fn)
        if m is not None and m.web:
            continue
        w.methods[fname] = _method_info(fname, fn, m, path.name)
        conc = getattr(fn, "__calque_concurrent__", None) or fn.__calque_function__.get("allow_concurrent_inputs")
        if conc:
            w.max_inputs = max(w.max_inputs, int(conc))
    return w


def import_script(path: Path) -> types.ModuleType:
    """Import ``path`` once with the stand-in ``modal`` in place (``calque run`` uses it on the submitter)."""
    path = path.resolve()
    if not path.is_file():
        raise WorkloadError(f"script {path} does not exist")
    return _import_script(path)


def build_workload(module: types.ModuleType, path: Path, name: str | None, parameters: dict[str, Any]) -> Workload:
    """Build the target ``name`` of a script already imported by ``import_script`` (no second import)."""
    path = path.resolve()
    params = dict(parameters)
    target, klass = _pick_target(module, path, name)
    w = _class_workload(klass, path, params) if klass is not None else _function_workload(path, target, params)
    w.parameters = params
    w.module_name = module.__name__
    w.digest = workload_digest(path.read_bytes(), target, params)
    return w


def load_workload(workload: str, parameters: dict[str, Any] | None = None) -> Workload:
    """Import the script with the stand-in ``modal`` and build its target. Raises ``WorkloadError``."""
    path, name = split_workload(workload)
    path = path.resolve()
    if not path.is_file():
        raise WorkloadError(f"workload script {path} does not exist")
    module = _import_script(path)
    return build_workload(module, path, name, dict(parameters or {}))
