"""Image layers holding the calque runtime's pinned dependencies (and, for the hosts that run notebooks,
the notebooks extra), for hosts whose test is not the install.

The ``runtime`` role's slow part on a fresh host is the virtualenv and its dependencies (ensurepip,
then about 25 wheels with botocore's thousands of files compiled): 10 to 20 CPU-seconds a host, paid
again by every scenario and e2e host that only needs calque there to test another role. A host booted
with the dependency layer starts as an institution's golden image would: ``/opt/calque/venv`` exists
with exactly the wheelhouse's pinned dependencies and no calque. The role still runs whole: it finds
the virtualenv, installs the pinned dependencies (all satisfied), then the calque wheel, and records it.
The ``runtime`` scenario boots without the layer and installs from nothing.

The notebooks layer goes one step further for the estate's two notebook hosts (the front door's hub
and teach-a's JupyterLab): pip installing the ~100 wheels of the wheelhouse's ``notebooks/`` (with
bytecode) was the estate's single biggest task, 121 s of the first ``site.yml``'s 552 s, plus 20 s to
unpack them. The layer holds exactly what that pip adds to the venv over the dependency layer, and not
the role's marker (``_calque_runtime_notebooks_marker``, ``calque-notebooks.sha256``): the role's
notebooks block still runs whole there (stages and unpacks the wheels, runs pip, which finds every
requirement satisfied, records the marker), so its path stays tested; teach-b boots without it.

Each layer is the upper directory of an overlay on what it goes over (the image; the dependency layer
and the image), filled in a chroot by the image's own Python and pip from the wheelhouse (no index),
keyed by what goes under it and the sha256s of the wheels it installs, built once per machine under a
lock beside the image, and used as a read-only lower layer of the hosts' roots (uppermost first).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from .paths import IMAGES_DIR, locked

VENV = "/opt/calque/venv"  # the runtime role's calque_runtime_venv default
LAYER_REVISION = 1  # bumped whenever the dependency layer's _fill changes, so the key changes with it
NOTEBOOKS_REVISION = 1  # the same for the notebooks layer
_STAGE = "tmp/calque-runtime-deps"  # inside the root while a layer is filled; removed before it is kept
_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LC_ALL": "C.UTF-8"}


class LayerError(RuntimeError):
    """The layer could not be built; the message has pip's or venv's output."""


def dependency_wheels(wheelhouse: Path) -> list[Path]:
    """The wheelhouse's wheels but calque's own."""
    return sorted(w for w in wheelhouse.glob("*.whl") if not w.name.startswith("calque-"))


def notebooks_wheels(wheelhouse: Path) -> list[Path]:
    """The wheels of the notebooks extra (``notebooks/``: only what it adds to the runtime's)."""
    return sorted((wheelhouse / "notebooks").glob("*.whl"))


def _sha256s(wheels: list[Path]) -> dict[str, str]:
    return {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels}


def _key(doc: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def layer_key(image: Path, wheelhouse: Path) -> str:
    return _key(
        {
            "image": image.parent.name,  # bookworm-<image key>
            "wheels": _sha256s(dependency_wheels(wheelhouse)),
            "venv": VENV,
            "revision": LAYER_REVISION,
        }
    )


def notebooks_layer_key(image: Path, wheelhouse: Path) -> str:
    return _key(
        {
            "deps": layer_key(image, wheelhouse),
            "wheels": _sha256s(notebooks_wheels(wheelhouse)),
            "requirements": (wheelhouse / "notebooks" / "requirements.txt").read_text(),
            "revision": NOTEBOOKS_REVISION,
        }
    )


def ensure_runtime_layer(image: Path, wheelhouse: Path) -> Path:
    """The layer directory for ``image`` and ``wheelhouse``'s pinned dependencies, built the first time."""
    pins = [line for line in (wheelhouse / "requirements.txt").read_text().splitlines() if line.strip()]
    requirements = "".join(f"{p}\n" for p in pins if not p.startswith("calque=="))
    fill = _filler([["/usr/bin/python3", "-m", "venv", VENV], _pip()])
    final = IMAGES_DIR / f"runtime-deps-{layer_key(image, wheelhouse)}"
    return _ensure(final, lambda tmp: _build(tmp, (image,), dependency_wheels(wheelhouse), requirements, fill))


def ensure_notebooks_layer(image: Path, wheelhouse: Path) -> Path:
    """The layer over the dependency layer (built first if need be) with the notebooks extra in the venv."""
    if not (wheelhouse / "notebooks" / "requirements.txt").is_file():
        raise LayerError(f"{wheelhouse} has no notebooks/ (`calque runtime wheelhouse --notebooks` makes it)")
    deps = ensure_runtime_layer(image, wheelhouse)
    requirements = (wheelhouse / "notebooks" / "requirements.txt").read_text()
    wheels = notebooks_wheels(wheelhouse)
    final = IMAGES_DIR / f"runtime-notebooks-{notebooks_layer_key(image, wheelhouse)}"
    return _ensure(final, lambda tmp: _build(tmp, (deps, image), wheels, requirements, _filler([_pip()])))


def layers_for(image: Path, runtime_deps: Path | None, notebooks: bool) -> tuple[Path, ...]:
    """A host's layers over ``image``, uppermost first: none without ``runtime_deps``; the notebooks
    layer above the dependency layer for a host that runs notebooks."""
    if runtime_deps is None:
        return ()
    deps = ensure_runtime_layer(image, runtime_deps)
    return (ensure_notebooks_layer(image, runtime_deps), deps) if notebooks else (deps,)


def _ensure(final: Path, build: Callable[[Path], None]) -> Path:
    """``final``/layer, built by ``build`` in a temporary directory the first time, under a lock."""
    if (final / "ready").exists():
        return final / "layer"
    with locked(final.parent / f"{final.name}.lock"):
        if (final / "ready").exists():  # another run built it while we waited
            return final / "layer"
        tmp = final.parent / f"{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        try:
            build(tmp)
        except BaseException:
            _unmount_all(tmp)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        (tmp / "ready").write_text("")
        tmp.rename(final)
    return final / "layer"


def _build(
    tmp: Path, lowers: tuple[Path, ...], wheels: list[Path], requirements: str, fill: Callable[[Path], None]
) -> None:
    """An overlay of ``lowers`` (uppermost first) whose upper dir is tmp/layer; ``wheels`` and
    ``requirements`` staged in it for ``fill``, then removed, so the layer keeps only what fill made."""
    layer, work, root = tmp / "layer", tmp / "work", tmp / "root"
    for d in (layer, work, root):
        d.mkdir(parents=True)
    lower = ":".join(str(p) for p in lowers)
    _mount(["-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={layer},workdir={work}", str(root)])
    try:
        _mount(["-t", "proc", "proc", str(root / "proc")])
        _mount(["--bind", "/dev", str(root / "dev")])
        stage = root / _STAGE
        stage.mkdir(parents=True)
        for wheel in wheels:
            shutil.copyfile(wheel, stage / wheel.name)
        (stage / "requirements.txt").write_text(requirements)
        fill(root)
        shutil.rmtree(stage)
    finally:
        _unmount_all(tmp)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)


def _pip() -> list[str]:
    """The role's own pip call (tasks/install.yml, tasks/notebooks.yml), on the staged wheels."""
    return [
        f"{VENV}/bin/pip",
        "install",
        "--quiet",
        "--no-index",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--find-links",
        f"/{_STAGE}",
        "--requirement",
        f"/{_STAGE}/requirements.txt",
    ]


def _filler(steps: list[list[str]]) -> Callable[[Path], None]:
    """The role's own steps, as root in the image: each argv in a chroot of the root."""

    def fill(root: Path) -> None:
        for argv in steps:
            r = subprocess.run(
                ["chroot", str(root), *argv], capture_output=True, text=True, check=False, timeout=900, env=_ENV
            )
            if r.returncode != 0:
                raise LayerError(f"{' '.join(argv)} in the image failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")

    return fill


def _mount(args: list[str]) -> None:
    r = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise LayerError(f"mount {' '.join(args)} failed: {r.stderr.strip()}")


def _unmount_all(tmp: Path) -> None:
    """Every mount under ``tmp``, deepest first."""
    prefix = str(tmp.resolve()) + "/"
    with open("/proc/self/mountinfo") as fh:
        targets = [line.split()[4] for line in fh if line.split()[4].startswith(prefix)]
    for target in sorted(targets, key=len, reverse=True):
        if subprocess.run(["umount", target], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)
