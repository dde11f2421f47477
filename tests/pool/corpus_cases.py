"""What each corpus script is given and what it must produce (shared by the in-process and e2e tests)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parent.parent / "corpus"


@dataclass(frozen=True)
class Case:
    script: str
    method: str = ""
    items: list[Any] = field(default_factory=list)  # JSONL lines for submit
    expected: list[Any] = field(default_factory=list)  # value per item, or ("error", "Type") for a failure
    parameters: dict[str, Any] = field(default_factory=dict)
    load_error: str | None = None  # substring of the WorkloadError/EnterError message
    enter_error: bool = False

    @property
    def path(self) -> Path:
        return CORPUS / self.script


def _err(t: str) -> tuple[str, str]:
    return ("error", t)


CASES = [
    Case(
        "llm_loader.py",
        "generate",
        [{"args": ["the quick brown fox jumps"], "kwargs": {"max_tokens": 2}}, "a b c d e f"],
        [
            '{"model": "tiny-llm", "steps": ["load", "gpu"], "out": ["the", "quick"]}',
            '{"model": "tiny-llm", "steps": ["load", "gpu"], "out": ["a", "b", "c", "d"]}',
        ],
    ),
    Case(
        "embed_batcher.py",
        "embed",
        ["a", "bb", "ccc", "dddd", "eeeee", "ffffff"],
        [{"len": n, "batch": 4 if n <= 4 else 2, "dim": 3} for n in range(1, 7)],
    ),
    Case(
        "parameterised.py", "greet", ["ada", "bob"], ["hi ada hi ada", "hi bob hi bob"], {"greeting": "hi", "repeat": 2}
    ),
    Case("dunder_lifecycle.py", "apply", [1, 5], [[3, True], [15, True]], {"scale": 3}),
    Case("async_class.py", "double", [1, 2, 3], [{"value": 2 * x, "same_loop": True} for x in (1, 2, 3)]),
    Case("concurrent_class.py", "fetch", list(range(8)), [x + 100 for x in range(8)]),
    Case("exit_hook.py", "count", ["a", "b", "c"], [1, 2, 3]),
    Case("several_methods.py", "slug", ["  Hello World ", "X"], ["t-hello-world", "t-x"]),
    Case("several_methods.py", "add", [{"args": [1, 2]}, {"args": [5], "kwargs": {"b": 10}}], [3, 15]),
    Case("old_kwargs.py", "run", [7], [[7, True]]),
    Case("image_imports.py", "mean", [[1, 2, 3], [4]], [2, 4]),
    Case("failing_items.py", "sqrt", [4, -1, 9], [2.0, _err("ValueError"), 3.0]),
    Case("function_app.py", "square", [3, 4], [9, 16]),
    Case("function_app.py", "shout", ["hey"], ["HEY"]),
    Case("inherited_lifecycle.py", "order_seen", [{"args": []}], [[True, "base", "child"]]),
    Case("missing_import.py", load_error="calque_nonexistent_pkg"),
    Case("unsupported.py", load_error="modal.Sandbox is not supported by the calque worker (unsupported.py line 6)"),
    Case("failing_enter.py", load_error="weights not found", enter_error=True),
]


def as_item_args(line: Any) -> tuple[list[Any], dict[str, Any]]:
    """How `calque pool submit` reads a JSONL line (an {args, kwargs} object, or one positional value)."""
    if isinstance(line, dict) and set(line) <= {"args", "kwargs"} and line:
        return list(line.get("args", [])), dict(line.get("kwargs", {}))
    return [line], {}
