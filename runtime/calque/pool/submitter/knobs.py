"""Modal's autoscaler knobs, read from a script's ``@app.cls`` / ``@app.function`` without running it.

A Modal script says how it wants to scale: ``min_containers`` (always up), ``max_containers`` (at
most), ``buffer_containers`` (idle ones kept beyond what the inputs need, while the function is
active), ``scaledown_window`` (seconds idle before a container stops); Modal's older names are
``keep_warm``, ``concurrency_limit`` and ``container_idle_timeout``. On calque one container is one
worker process, and an instance runs the spec's ``workers`` of them, so counts of containers become
counts of instances by dividing by ``workers``, rounding up.

The script is parsed (``ast``), never imported: the controller reading inventory should not run a
lab's code (nor need its imports). Only literal values are read; a keyword given by an expression is
reported in ``notes`` and left to inventory.
"""

from __future__ import annotations

import ast
from pathlib import Path

from calque.errors import UsageError
from calque.models.warmth import ModalKnobs

KNOBS = ("min_containers", "max_containers", "buffer_containers", "scaledown_window")
OLDER = {
    "keep_warm": "min_containers",
    "concurrency_limit": "max_containers",
    "container_idle_timeout": "scaledown_window",
}
_DECORATORS = ("cls", "function")


def _decorator_keywords(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.keyword] | None:
    """The keywords of an ``@<app>.cls(...)`` / ``@<app>.function(...)`` on ``node``; None when it has none."""
    for dec in node.decorator_list:
        if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr in _DECORATORS:
            return list(dec.keywords)
    return None


def read_knobs(workload: str) -> ModalKnobs | None:
    """The knobs of ``script.py[::Target]``'s target (None when it has no ``@app.cls``/``@app.function``)."""
    script, _, target = workload.partition("::")
    path = Path(script).expanduser()
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except OSError as exc:
        raise UsageError(f"cannot read workload script {path}: {exc.strerror or exc}") from None
    except SyntaxError as exc:
        raise UsageError(f"workload script {path} line {exc.lineno}: {exc.msg}") from None
    found = {
        n.name: kws
        for n in tree.body
        if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and (kws := _decorator_keywords(n)) is not None
    }
    if target:
        if target not in found:
            return None
        name = target
    elif len(found) == 1:
        name = next(iter(found))
    else:
        return None  # several targets and none named: the workload names one, or none has knobs
    knobs = ModalKnobs(target=name)
    for kw in found[name]:
        key = OLDER.get(kw.arg or "", kw.arg)
        if key not in KNOBS:
            continue
        if kw.arg != key:
            knobs.notes.append(f"{kw.arg} is Modal's older name for {key}")
        try:
            value = ast.literal_eval(kw.value)
        except ValueError:
            knobs.notes.append(f"{kw.arg} is not a literal on line {kw.value.lineno}: set it in inventory")
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            knobs.notes.append(f"{kw.arg}={value!r} is not a count or seconds: ignored")
            continue
        setattr(knobs, str(key), int(value))
    return knobs
