"""A package's names loaded on first use (PEP 562 ``__getattr__``), so importing the package costs
only what its caller touches: ``calque.models`` (one family at a time) and ``calque.aws.acquire``
(``calque pool status`` imports its scaling parts, not the acquirer)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, home: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """``package``'s ``__getattr__``: a name from its module in ``home``, then kept in ``namespace``
    (the package's globals), so later lookups skip this function."""

    def load(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return load
