"""Every module that runs a calque operation takes exactly its request model's fields, and is only that.

The argument spec is read the way ansible-test's validate-modules reads it: by running the module's
``main()`` with the one call it makes (``run_op``) replaced by a recorder.
"""

from __future__ import annotations

import ast
import importlib
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
from calque.ops import OPERATIONS, operation
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from support.ansible import COLLECTIONS

MODULES = COLLECTIONS / "ansible_collections" / "calque" / "gpu" / "plugins" / "modules"
OP_MODULES = sorted(p.stem for p in MODULES.glob("*.py") if "run_op(" in p.read_text())
# Modules that run on the controller as an action plugin of the same name: it calls the operation.
ACTIONS = MODULES.parent / "action"
ACTION_MODULES = sorted(p.stem for p in ACTIONS.glob("*.py"))
SCALARS: dict[str, type] = {"str": str, "path": str, "raw": object, "int": int, "bool": bool, "float": float}


def _load(name: str) -> types.ModuleType:
    if not any(isinstance(f, _AnsibleCollectionFinder) for f in __import__("sys").meta_path):
        _AnsibleCollectionFinder(paths=[str(COLLECTIONS)], scan_sys_paths=True)._install()
    return importlib.import_module(f"ansible_collections.calque.gpu.plugins.modules.{name}")


def recorded_call(name: str) -> tuple[str, dict[str, Any]]:
    """The operation name and argument spec module ``name`` hands to run_op."""
    module = _load(name)
    seen: list[tuple[str, dict[str, Any]]] = []
    original = module.run_op
    module.run_op = lambda _cls, op, spec, **_kw: seen.append((op, spec))
    try:
        module.main()
    finally:
        module.run_op = original
    assert len(seen) == 1, f"{name}: main() must make exactly one run_op call"
    return seen[0]


def _unoptional(annotation: Any) -> Any:
    if get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return _unoptional(rest[0]) if len(rest) == 1 else annotation
    if get_origin(annotation) is typing.Annotated:  # a validated str (PoolName) is still a str option
        return get_args(annotation)[0]
    return annotation


def problems(spec: dict[str, Any], model: type[BaseModel], where: str) -> list[str]:
    """How ``spec`` (an Ansible argument spec) and ``model`` (a pydantic model) disagree."""
    out = []
    fields = model.model_fields
    out += [f"{where}{k}: in the argument spec, not in {model.__name__}" for k in sorted(set(spec) - set(fields))]
    out += [f"{where}{k}: in {model.__name__}, not in the argument spec" for k in sorted(set(fields) - set(spec))]
    for key in sorted(set(spec) & set(fields)):
        out += _option_problems(spec[key], fields[key], f"{where}{key}")
    return out


def _option_problems(opt: dict[str, Any], field: FieldInfo, where: str) -> list[str]:
    out = []
    kind = opt.get("type", "str")
    ann = _unoptional(field.annotation)
    if bool(opt.get("required", False)) != field.is_required():
        out.append(f"{where}: required={opt.get('required', False)} but the model says {field.is_required()}")
    default = field.get_default(call_default_factory=True)
    if get_origin(ann) is Literal:
        if sorted(opt.get("choices") or []) != sorted(get_args(ann)):
            out.append(f"{where}: choices {opt.get('choices')} but the model allows {list(get_args(ann))}")
        ann = str
    elif opt.get("choices"):
        out.append(f"{where}: choices {opt['choices']} but the model's type is not a Literal")
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        if kind != "dict" or "options" not in opt:
            out.append(f"{where}: the model has a {ann.__name__}; the spec needs type=dict with options")
            return out
        out += problems(opt["options"], ann, f"{where}.")
        if isinstance(default, BaseModel) and default != ann.model_validate(opt.get("default") or {}):
            out.append(f"{where}: default {opt.get('default')} differs from the model's {default!r}")
        return out
    if not field.is_required() and opt.get("default") != default:
        out.append(f"{where}: default {opt.get('default')!r} but the model's is {default!r}")
    if kind == "list":
        elem = SCALARS.get(opt.get("elements", "raw"), dict)
        got = get_args(ann)[0] if get_args(ann) else object
        if isinstance(got, type) and issubclass(got, BaseModel):  # a list of models: elements=dict with options
            if opt.get("elements") != "dict" or "options" not in opt:
                return [*out, f"{where}: a list of {got.__name__}; the spec needs elements=dict with options"]
            return out + problems(opt["options"], got, f"{where}[].")
        got = dict if get_origin(got) is dict else got
        if get_origin(ann) is not list or got is not elem:
            out.append(f"{where}: list of {opt.get('elements')} but the model's type is {ann}")
    elif kind == "dict":
        if get_origin(ann) is not dict and ann is not dict:
            out.append(f"{where}: dict but the model's type is {ann}")
    elif SCALARS.get(kind) is not ann:
        out.append(f"{where}: type {kind} but the model's type is {ann}")
    return out


def test_every_module_runs_an_operation() -> None:
    assert sorted(p.stem for p in MODULES.glob("*.py")) == sorted(OP_MODULES + ACTION_MODULES)
    # runtime staging is part of pool_spec
    assert sorted(n for n in OPERATIONS if n != "runtime") == sorted(OP_MODULES + ACTION_MODULES)
    for name in ACTION_MODULES:
        assert f'operation("{name}")' in (ACTIONS / f"{name}.py").read_text(), f"action {name} runs no operation"


@pytest.mark.parametrize("name", ACTION_MODULES)
def test_an_action_plugin_takes_the_options_its_module_documents(name: str) -> None:
    module = _load(name)
    seen: list[dict[str, Any]] = []

    class Recorder:
        def __init__(self, argument_spec: dict[str, Any], **_kw: Any) -> None:
            seen.append(argument_spec)

        def fail_json(self, **_kw: Any) -> None:
            pass

    original = module.AnsibleModule
    module.AnsibleModule = Recorder
    try:
        module.main()
    finally:
        module.AnsibleModule = original
    action = importlib.import_module(f"ansible_collections.calque.gpu.plugins.action.{name}")
    assert seen == [action.ARGUMENT_SPEC]


@pytest.mark.parametrize("name", OP_MODULES)
def test_module_argument_spec_matches_its_request_model(name: str) -> None:
    op, spec = recorded_call(name)
    assert op == name
    assert problems(spec, operation(op).Request, "") == []


def test_the_contract_check_catches_drift() -> None:
    _, spec = recorded_call("pool_queue")
    model = operation("pool_queue").Request
    drifted = {**spec, "visibility_timeout": {"type": "str"}, "extra": {"type": "int"}}
    drifted["state"] = {**spec["state"], "choices": ["present"], "default": "absent"}
    found = problems({k: v for k, v in drifted.items() if k != "encryption"}, model, "")
    assert any(p.startswith("extra: in the argument spec") for p in found)
    assert any(p.startswith("encryption: in PoolQueueRequest") for p in found)
    assert any(p.startswith("visibility_timeout: type str") for p in found)
    assert any("state: choices ['present']" in p for p in found)
    assert any("state: default 'absent'" in p for p in found)


def _code_lines(path: Path) -> int:
    """Lines of code beyond DOCUMENTATION/EXAMPLES/RETURN and the argument spec."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        named = isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        if named and node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN", "argument_spec"):  # type: ignore[attr-defined]
            skip.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))  # type: ignore[attr-defined]
    lines = path.read_text().splitlines()
    return sum(
        1 for i, line in enumerate(lines, 1) if i not in skip and line.strip() and not line.lstrip().startswith("#")
    )


@pytest.mark.parametrize("name", sorted(p.stem for p in MODULES.glob("*.py")))
def test_modules_are_docs_an_argument_spec_and_one_call(name: str) -> None:
    assert _code_lines(MODULES / f"{name}.py") <= 20


def test_the_launch_options_are_declared_once_for_pool_group_and_ec2_cohort() -> None:
    """One request model, one argument spec piece, one doc fragment."""
    import yaml

    _load("pool_group")  # installs the collection finder
    launch = importlib.import_module("ansible_collections.calque.gpu.plugins.module_utils._launch")
    fragment = importlib.import_module("ansible_collections.calque.gpu.plugins.doc_fragments.launch")
    documented = yaml.safe_load(fragment.ModuleDocFragment.DOCUMENTATION)["options"]
    assert set(documented) == set(launch.LAUNCH_OPTIONS)  # one doc fragment for one argument spec piece
    from calque.models.acquire import LaunchOptions

    assert set(LaunchOptions.model_fields) == set(launch.LAUNCH_OPTIONS)  # one request model for them too
    for name in ("pool_group", "ec2_cohort"):
        assert issubclass(operation(name).Request, LaunchOptions), f"{name}'s request does not extend LaunchOptions"
        _, spec = recorded_call(name)
        shared = {key for key, value in launch.LAUNCH_OPTIONS.items() if spec.get(key) is value}
        assert shared == set(launch.LAUNCH_OPTIONS), f"{name} declares launch options of its own"
