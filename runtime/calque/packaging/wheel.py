"""The calque wheel, built by the standard build backend (setuptools) from a clean copy of the sources.

The copy holds only what a wheel may carry: ``pyproject.toml``, ``README.md`` and the package's
files minus editor and build leftovers (``foo.py~``, ``.foo.py.swp``, ``__pycache__``), with fixed
modes. ``SOURCE_DATE_EPOCH`` (default: 1980-01-01, zip's first date) fixes every timestamp, so the
same sources give the same bytes, hence one sha256 per name and version.

Because the bytes follow from the sources, a built wheel is kept in the user's cache
(``$CALQUE_CACHE_DIR`` or ``$XDG_CACHE_HOME/calque``, else ``~/.cache/calque``; ``wheels/<digest>/``)
under the digest of everything that decides them (each packaged file's path and bytes, the date,
the build backend's version): a controller that runs ``pool.yml`` again with unchanged sources
copies the wheel it built before instead of building it again.
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


def _package_files(root: Path) -> list[Path]:
    """The files a wheel of ``root`` carries (relative to it), in a fixed order."""
    files = [Path(name) for name in _TOP_FILES if (root / name).is_file()]
    for path in sorted((root / "runtime" / "calque").rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and is_package_file(rel):
            files.append(rel)
    return files


def _copy_sources(root: Path, dest: Path) -> None:
    for rel in _package_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target)
        target.chmod(0o644)  # the builder records modes: the checkout's umask must not change the bytes


def cache_root() -> Path:
    """The user's calque cache: ``$CALQUE_CACHE_DIR``, ``$XDG_CACHE_HOME/calque`` or ``~/.cache/calque``."""
    if os.environ.get("CALQUE_CACHE_DIR"):
        return Path(os.environ["CALQUE_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "calque"


def source_digest(root: Path, date_epoch: str) -> str:
    """The digest of everything that decides the wheel's bytes: each packaged file's path and content,
    the build date, and the versions of the build backend and of this interpreter."""
    h = hashlib.sha256()
    backend = importlib.metadata.version("setuptools")  # only in-place builds are kept (build_wheel)
    h.update(f"{__version__}\0{date_epoch}\0{backend}\0{sys.version_info[:2]}\0".encode())
    for rel in _package_files(root):
        data = (root / rel).read_bytes()
        h.update(f"{rel.as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _can_build_in_place() -> bool:
    """Whether this interpreter's setuptools is new enough for pyproject.toml (PEP 639 license: 77)."""
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 77


def build_wheel(dest_dir: str | Path, *, source: Path | None = None, cached: bool = True) -> Path:
    """Build ``calque-<version>-py3-none-any.whl`` into ``dest_dir`` with ``pip wheel``; returns its path.

    Without build isolation when this interpreter has setuptools >= 77 (no index needed); otherwise
    pip fetches the build backend from its configured index. ``cached``: a wheel built before from the
    same sources (``source_digest``) is copied from the user's cache, and a new build is kept there.
    """
    root = source or source_root()
    out = Path(dest_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("SOURCE_DATE_EPOCH", str(DEFAULT_SOURCE_DATE_EPOCH))
    kept = None
    if cached and _can_build_in_place():  # an isolated build's backend is whatever the index serves: not kept
        kept = cache_root() / "wheels" / source_digest(root, env["SOURCE_DATE_EPOCH"]) / wheel_name()
    if kept is not None and kept.is_file():
        target = out / kept.name
        shutil.copyfile(kept, target)
        return target
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
    if kept is not None:
        _keep(target, kept)
    return target


def _keep(wheel: Path, kept: Path) -> None:
    """Put a copy in the cache, whole or not at all (a rename); a cache that cannot be written is skipped."""
    partial: Path | None = None
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=kept.parent, prefix=".partial-", delete=False) as tmp:
            partial = Path(tmp.name)
            with wheel.open("rb") as src:
                shutil.copyfileobj(src, tmp)
        os.replace(partial, kept)
    except OSError:
        if partial is not None:
            partial.unlink(missing_ok=True)  # a full disk leaves no half wheel behind


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
