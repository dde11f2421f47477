"""A wheelhouse: the calque wheel plus every runtime dependency at the version CI tested, for hosts with no index.

``OUT_DIR`` holds exactly one ``calque-<version>-py3-none-any.whl``, the dependency wheels,
``requirements.txt`` (``name==version`` lines, optionally with ``--hash``) and ``SHA256SUMS``
(``sha256sum -c`` format). ``pip install --no-index --find-links OUT_DIR -r OUT_DIR/requirements.txt``
installs calque with its pinned dependencies. The pins come from the package's own
``data/runtime-constraints.txt`` (generated from ``constraints.txt``), so no repository is needed.

With ``notebooks`` the wheelhouse also holds ``notebooks/``: the ``notebooks`` extra's wheels (JupyterHub,
JupyterLab, the Python ``configurable-http-proxy``; ``data/notebooks-constraints.txt``) with their own
``requirements.txt`` and ``SHA256SUMS``. The top level stays the runtime's alone (hosts without notebooks
get only it); a host that runs notebooks installs ``notebooks/requirements.txt`` into the runtime's venv
too, with ``--find-links notebooks`` (the Ansible runtime and jupyterhub roles do).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from calque import __version__
from calque.errors import UsageError
from calque.packaging.wheel import build_wheel, cache_root, sha256_file, wheel_name

REQUIREMENTS = "requirements.txt"
NOTEBOOKS = "notebooks"  # the folder of the notebooks extra's wheels, with its own requirements.txt
SUMS = "SHA256SUMS"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Wheelhouse:
    path: Path
    calque_wheel: str  # file name inside ``path``
    pins: dict[str, str]  # distribution name -> exact version, calque included
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256


def runtime_pins() -> dict[str, str]:
    """The runtime's dependency closure pinned as CI tested it (``calque/data/runtime-constraints.txt``)."""
    return _read_pins("runtime-constraints.txt")


def notebooks_pins() -> dict[str, str]:
    """What the ``notebooks`` extra adds to the runtime's closure, pinned alike (``data/notebooks-constraints.txt``)."""
    return _read_pins("notebooks-constraints.txt")


def _read_pins(name: str) -> dict[str, str]:
    text = resources.files("calque").joinpath(f"data/{name}").read_text()
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name] = version
    return pins


def default_python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def default_platform() -> str:
    """This controller's platform tag (``linux_x86_64`` -> ``manylinux2014_x86_64``: what PyPI ships)."""
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "manylinux2014_" + plat.removeprefix("linux_") if plat.startswith("linux_") else plat


def _platforms(plat: str, notebooks: bool) -> list[str]:
    """``plat`` and, for the notebooks' wheels, its glibc 2.28 tag too: some (pyzmq, greenlet, argon2's
    bindings) ship only manylinux_2_28 wheels, and every distribution the roles support has glibc >= 2.34."""
    if notebooks and plat.startswith("manylinux2014_"):
        return [plat, "manylinux_2_28_" + plat.removeprefix("manylinux2014_")]
    return [plat]


def _wheel_dist(filename: str) -> tuple[str, str]:
    """(normalised name, version) of a wheel file name."""
    name, version = filename.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), version


def _pip_download(args: list[str], progress: Progress) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip()
        tail = [*tail[-30:], line]
        if line.startswith(("Collecting", "Saved", "Successfully", "Processing")):
            progress("  " + line.strip())
    if proc.wait() != 0:
        raise UsageError(
            "pip could not download the pinned runtime dependencies (is the index reachable, and are wheels "
            "published for that --python-version/--platform?):\n" + "\n".join(tail)
        )


def build_wheelhouse(
    out_dir: str | Path,
    *,
    python_version: str | None = None,
    platform: str | None = None,
    hashes: bool = False,
    wheel: str | Path | None = None,
    cached: bool = True,
    notebooks: bool = False,
    progress: Progress = lambda _msg: None,
) -> Wheelhouse:
    """Write the calque wheel and its pinned dependency wheels, ``requirements.txt`` and ``SHA256SUMS`` to ``out_dir``.

    Only binary wheels for ``python_version``/``platform`` (default: this controller's), fetched with
    ``pip download`` from pip's configured index or cache. ``wheel`` reuses a built calque wheel.
    ``cached``: the dependency wheels of an earlier build with the same pins, Python, platform and
    calque requirements come from the user's calque cache (``dependency-wheels/<key>/``, checked
    against the sha256s recorded when they were kept) instead of pip; a download is kept there.
    ``notebooks``: the ``notebooks`` extra's wheels too, in ``notebooks/`` with their own index.
    """
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"wheelhouse {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    stale = [p.name for p in out.iterdir() if p.suffix == ".whl" or p.name in (REQUIREMENTS, SUMS, NOTEBOOKS)]
    if stale:
        raise UsageError(f"wheelhouse {out} already holds {', '.join(sorted(stale)[:3])}...: give an empty directory")
    extra = notebooks_pins() if notebooks else {}
    pins = {**runtime_pins(), **extra}
    with tempfile.TemporaryDirectory(prefix="calque-wheelhouse-") as tmp:
        if wheel is None:
            progress(f"building {wheel_name()} (setuptools, SOURCE_DATE_EPOCH)")
            calque_whl = build_wheel(tmp)
        else:
            calque_whl = Path(wheel).expanduser()
            if calque_whl.name != wheel_name():
                raise UsageError(f"wheel {calque_whl.name} is not {wheel_name()} (this calque's version)")
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("".join(f"{n}=={v}\n" for n, v in pins.items()))
        shutil.copyfile(calque_whl, out / calque_whl.name)
        pyver = python_version or default_python_version()
        plat = platform or default_platform()
        kept = _dependency_cache(pins, pyver, plat, out / calque_whl.name, notebooks) if cached else None
        if kept is not None and _restore(kept, out):
            progress(f"{len(pins)} pinned dependencies for Python {pyver} on {plat} from the cache {kept}")
        else:
            progress(f"downloading {len(pins)} pinned dependencies for Python {pyver} on {plat}")
            _pip_download(
                [
                    "--only-binary=:all:",
                    "--python-version",
                    pyver,
                    *(arg for tag in _platforms(plat, notebooks) for arg in ("--platform", tag)),
                    "--constraint",
                    str(constraints),
                    "--dest",
                    str(out),
                    str(out / calque_whl.name) + ("[notebooks]" if notebooks else ""),
                ],
                progress,
            )
            if kept is not None:
                _keep([p for p in out.glob("*.whl") if p.name != calque_whl.name], kept)
    return _index(out, calque_whl.name, pins, hashes, progress, notebooks=extra)


DEPENDENCY_INDEX = "wheels.json"  # file name -> sha256 of each kept dependency wheel


def _dependency_cache(pins: dict[str, str], pyver: str, plat: str, calque_whl: Path, notebooks: bool = False) -> Path:
    """Where the dependency wheels for these pins, this Python and platform, and this wheel's requirements live.

    The key holds everything pip's choice depends on: the pins, the target, and what the calque wheel
    asks for (its ``Requires-Dist`` lines), so a new dependency or pin is a new folder, never a stale one.
    """
    with zipfile.ZipFile(calque_whl) as whl:
        metadata = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        requires = sorted(
            line for line in whl.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")
        )
    doc: dict[str, object] = {"pins": pins, "python": pyver, "platform": plat, "requires": requires}
    if notebooks:  # only then: the runtime's own wheelhouses keep their cache folders
        doc["extras"] = ["notebooks"]
    key = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "dependency-wheels" / key


def _restore(kept: Path, out: Path) -> bool:
    """Copy the kept wheels into ``out`` when every one is whole (its recorded sha256); else copy nothing."""
    try:
        recorded: dict[str, str] = json.loads((kept / DEPENDENCY_INDEX).read_text())
    except (OSError, ValueError):
        return False
    if not recorded or not all(
        (kept / name).is_file() and sha256_file(kept / name) == digest for name, digest in recorded.items()
    ):
        return False
    for name in recorded:
        shutil.copyfile(kept / name, out / name)
    return True


def _keep(wheels: list[Path], kept: Path) -> None:
    """Keep a copy of the downloaded wheels, whole or not at all (one rename); an unwritable cache is skipped."""
    partial: Path | None = None
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(dir=kept.parent, prefix=".partial-"))
        for wheel in wheels:
            shutil.copyfile(wheel, partial / wheel.name)
        index = {wheel.name: sha256_file(wheel) for wheel in wheels}
        (partial / DEPENDENCY_INDEX).write_text(json.dumps(index, indent=1, sort_keys=True))
        shutil.rmtree(kept, ignore_errors=True)  # a broken earlier copy: replaced
        os.replace(partial, kept)
        partial = None
    except OSError:
        pass
    finally:
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)


def _index(
    out: Path,
    calque_file: str,
    pins: dict[str, str],
    hashes: bool,
    progress: Progress,
    *,
    notebooks: dict[str, str],
) -> Wheelhouse:
    """Check every wheel is pinned, move the ``notebooks`` extra's into ``notebooks/``, then write each
    folder's ``requirements.txt`` and ``SHA256SUMS``."""
    wanted = {re.sub(r"[-_.]+", "-", n).lower(): v for n, v in pins.items()}
    wanted["calque"] = __version__
    extra = {re.sub(r"[-_.]+", "-", n).lower() for n in notebooks}
    found: dict[str, tuple[str, str]] = {}
    for wheel in sorted(out.glob("*.whl")):
        dist, version = _wheel_dist(wheel.name)
        if wanted.get(dist) != version:
            raise UsageError(f"{wheel.name} is not pinned in the shipped constraints ({dist}=={wanted.get(dist)})")
        found[dist] = (version, wheel.name)
        if dist in extra:
            (out / NOTEBOOKS).mkdir(exist_ok=True)
            wheel.rename(out / NOTEBOOKS / wheel.name)
    sums: dict[str, str] = {}
    for folder in (out / NOTEBOOKS, out):  # notebooks/ first: its SHA256SUMS is listed in the top one's
        if not folder.is_dir():
            continue
        files = {p.name: sha256_file(p) for p in sorted(folder.glob("*.whl"))}
        lines = [
            f"{dist}=={version}" + (f" --hash=sha256:{files[name]}" if hashes else "") + "\n"
            for dist, (version, name) in sorted(found.items())
            if name in files
        ]
        (folder / REQUIREMENTS).write_text("".join(lines))
        listed = {**files, REQUIREMENTS: sha256_file(folder / REQUIREMENTS)}
        if folder == out and (out / NOTEBOOKS).is_dir():
            listed[f"{NOTEBOOKS}/{SUMS}"] = sha256_file(out / NOTEBOOKS / SUMS)
        (folder / SUMS).write_text("".join(f"{digest}  {name}\n" for name, digest in sorted(listed.items())))
        prefix = "" if folder == out else f"{NOTEBOOKS}/"
        sums.update({prefix + name: digest for name, digest in listed.items()})
        progress(f"wheelhouse {folder}: {len(files)} wheels, {REQUIREMENTS}, {SUMS}")
    return Wheelhouse(out, calque_file, {d: v for d, (v, _) in found.items()}, sums)
