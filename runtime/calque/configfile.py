"""Reading the YAML files people write (pool specs, MIG layouts, host and session configuration).

One reader, so every file fails the same way: a ``UsageError`` that names the file, the field and
what is wrong with it, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from calque.errors import UsageError, format_validation_error

M = TypeVar("M", bound=BaseModel)


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``on``, ``off``, ``yes`` and ``no`` as booleans; as mapping keys (config names such
    as a layout called ``off``) they are kept as the text written, so ``--select off`` finds them."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag == "tag:yaml.org,2002:bool":
                key_node.tag = "tag:yaml.org,2002:str"
        return super().construct_mapping(node, deep=deep)


def read_mapping(path: str | Path, what: str, *, empty_ok: bool = False) -> dict[str, Any]:
    """The YAML (or JSON) mapping in ``path`` (``-`` reads standard input)."""
    p = Path(path)
    try:
        text = sys.stdin.read() if str(path) == "-" else p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise UsageError(f"{what} {p} does not exist; check the path") from exc
    except OSError as exc:
        raise UsageError(f"cannot read {what} {p}: {exc}") from exc
    try:
        doc = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise UsageError(f"{what} {p} is not valid YAML: {exc}") from exc
    if doc is None and empty_ok:
        return {}
    if not isinstance(doc, dict):
        raise UsageError(f"{what} {p} must be a mapping of settings, not {type(doc).__name__}")
    return doc


def validate(model: type[M], doc: Any, path: str | Path, what: str) -> M:
    """``model`` validated from ``doc``, or a ``UsageError`` naming every bad field of ``path``."""
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise UsageError(format_validation_error(exc, f"{what} {path}")) from exc


def load_model(model: type[M], path: str | Path, what: str, *, empty_ok: bool = False) -> M:
    """Read ``path`` and validate it as ``model`` in one step."""
    return validate(model, read_mapping(path, what, empty_ok=empty_ok), path, what)


def load_service_config(model: type[M], path: Path | None, default: Path, what: str) -> M:
    """A service's config file: ``path``, else ``default`` where it exists, else every default (so a
    host runs with no file); a missing file named explicitly is an error, an empty one all defaults."""
    if path is None:
        if not default.exists():
            return model()
        path = default
    return load_model(model, path, what, empty_ok=True)
