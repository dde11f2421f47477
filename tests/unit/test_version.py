"""One version everywhere: the Python package, its distribution metadata and the collection."""

from __future__ import annotations

from pathlib import Path

import calque
import tomllib
import yaml

REPO = Path(__file__).resolve().parents[2]


def test_runtime_pyproject_and_collection_versions_agree() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    galaxy = yaml.safe_load((REPO / "collections/ansible_collections/calque/gpu/galaxy.yml").read_text())["version"]
    assert calque.__version__ == pyproject == galaxy, (
        f"calque.__version__={calque.__version__} pyproject={pyproject} galaxy.yml={galaxy}: bump all three together"
    )
