"""The calque wheel, built by the standard build backend (setuptools) from a clean copy of the sources.

The copy holds only what a wheel may carry: ``pyproject.toml``, ``README.md`` and the package's
files minus editor and build leftovers (``foo.py~``, ``.foo.py.swp``, ``__pycache__``), with fixed
modes. ``SOURCE_DATE_EPOCH`` (default: 1980-01-01, zip's first date) fixes every timestamp, so the
same sources give the same bytes, hence one sha256 per name and version.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import calque
from calque import __version__
from calque.errors import UsageError

DEFAULT_SOURCE_DATE_EPOCH = 315532800  # 1980-01-01T00:00:00Z: the earliest date a zip entry can carry
_LEFTOVER_SUFFIXES = (".pyc", ".pyo", ".swp", ".swo", ".swx", ".orig", ".rej", ".bak", ".tmp")
_TOP_FILES = ("pyproject.toml", "README.md", "LICENSE")


def wheel_name(version: str = __version__) -> str:
    return f"calque-{version}-py3-none-any.whl"


def source_root() -> Path:
    """The source tree the running calque comes from (``runtime/calque`` beside ``pyproject.toml``)."""
    root = Path(calque.__file__).resolve().parent.parent.parent
    if not (root / "pyproject.toml").is_file() or not (root / "runtime" / "calque").is_dir():
        raise UsageError(
            f"the running calque ({Path(calque.__file__).parent}) is not a source checkout: build the wheel "
            "where the sources are, or pass a built wheel (--wheel) or wheelhouse (--wheelhouse)"
        )
    return root


def is_package_file(path: Path) -> bool:
    """False for editor backups, swap files, caches and hidden files: they never go in the wheel."""
    name = path.name
    return not (
        name.startswith((".", "#"))
        or name.endswith("~")
        or name.endswith(_LEFTOVER_SUFFIXES)
        or "__pycache__" in path.parts
    )


def _copy_sources(root: Path, dest: Path) -> None:
    for name in _TOP_FILES:
        if (root / name).is_file():
            shutil.copyfile(root / name, dest / name)
    pkg = root / "runtime" / "calque"
    for path in sorted(pkg.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or not is_package_file(rel):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        target.chmod(0o644)  # the builder records modes: the checkout's umask must not change the bytes


def _can_build_in_place() -> bool:
    """Whether this interpreter's setuptools is new enough for pyproject.toml (PEP 639 license: 77)."""
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 77


def build_wheel(dest_dir: str | Path, *, source: Path | None = None) -> Path:
    """Build ``calque-<version>-py3-none-any.whl`` into ``dest_dir`` with ``pip wheel``; returns its path.

    Without build isolation when this interpreter has setuptools >= 77 (no index needed); otherwise
    pip fetches the build backend from its configured index.
    """
    root = source or source_root()
    out = Path(dest_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("SOURCE_DATE_EPOCH", str(DEFAULT_SOURCE_DATE_EPOCH))
    env["PYTHONHASHSEED"] = "0"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    with tempfile.TemporaryDirectory(prefix="calque-src-") as tmp, tempfile.TemporaryDirectory() as wheels:
        src = Path(tmp) / "calque"  # one fixed name: nothing of the temporary path reaches the wheel
        src.mkdir()
        _copy_sources(root, src)
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", wheels, str(src)]
        if _can_build_in_place():
            cmd.insert(4, "--no-build-isolation")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp, check=False)
        built = Path(wheels) / wheel_name()
        if proc.returncode != 0 or not built.is_file():
            raise UsageError(f"building the calque wheel failed ({' '.join(cmd)}):\n{proc.stdout}{proc.stderr}")
        target = out / built.name
        shutil.copyfile(built, target)
    return target


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
