"""Which inventory file set a variable: the host_vars and group_vars Ansible reads beside the
inventory and the playbook, searched as Ansible ranks them (host before groups before ``all``,
the playbook's folder before the inventory's). None where no such file sets it (extra vars, a
dynamic inventory, the inventory file itself)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

_SUFFIXES = ("", ".yml", ".yaml", ".json")


class _TolerantLoader(yaml.SafeLoader):
    """Reads group_vars with Ansible's tags (``!vault``, ``!unsafe``) as plain values."""


def _any_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    return None


_TolerantLoader.add_multi_constructor("!", _any_tag)


def _files(folder: Path, name: str) -> Iterator[Path]:
    for suffix in _SUFFIXES:
        p = folder / f"{name}{suffix}"
        if p.is_file():
            yield p
    d = folder / name
    if d.is_dir():
        yield from sorted(f for f in d.rglob("*") if f.is_file() and f.suffix in _SUFFIXES)


def _sets(path: Path, variable: str) -> bool:
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_TolerantLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(doc, dict) and variable in doc


def find_origin(
    variable: str, host: str, groups: Sequence[str], inventory_dir: str | None, playbook_dir: str | None
) -> str | None:
    bases = [Path(d) for d in (playbook_dir, inventory_dir) if d]
    order = [("host_vars", host), *(("group_vars", g) for g in reversed(groups) if g != "all"), ("group_vars", "all")]
    for kind, name in order:
        for base in bases:
            for path in _files(base / kind, name):
                if _sets(path, variable):
                    return str(path)
    return None
