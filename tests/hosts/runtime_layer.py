"""An image layer holding the calque runtime's pinned dependencies, for hosts whose test is not the install.

The ``runtime`` role's slow part on a fresh host is the virtualenv and its dependencies (ensurepip,
then about 25 wheels with botocore's thousands of files compiled): 10 to 20 CPU-seconds a host, paid
again by every scenario and e2e host that only needs calque there to test another role. A host booted
with this layer starts as an institution's golden image would: ``/opt/calque/venv`` exists with
exactly the wheelhouse's pinned dependencies and no calque. The role still runs whole: it finds the
virtualenv, installs the pinned dependencies (all satisfied), then the calque wheel, and records it.
The ``runtime`` scenario boots without the layer and installs from nothing.

The layer is the upper directory of an overlay on the image, filled in a chroot by the image's own
Python and pip from the wheelhouse (no index), keyed by the image and the pinned dependency wheels,
built once per machine under a lock beside the image and used as a second read-only lower layer.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from .paths import IMAGES_DIR, locked

VENV = "/opt/calque/venv"  # the runtime role's calque_runtime_venv default
LAYER_REVISION = 1  # bumped whenever _fill changes, so the key changes with it
_STAGE = "tmp/calque-runtime-deps"  # inside the root while the layer is filled; removed before it is kept


class LayerError(RuntimeError):
    """The layer could not be built; the message has pip's or venv's output."""


def dependency_wheels(wheelhouse: Path) -> list[Path]:
    """The wheelhouse's wheels but calque's own."""
    return sorted(w for w in wheelhouse.glob("*.whl") if not w.name.startswith("calque-"))


def layer_key(image: Path, wheelhouse: Path) -> str:
    doc = {
        "image": image.parent.name,  # bookworm-<image key>
        "wheels": {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in dependency_wheels(wheelhouse)},
        "venv": VENV,
        "revision": LAYER_REVISION,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def ensure_runtime_layer(image: Path, wheelhouse: Path) -> Path:
    """The layer directory for ``image`` and ``wheelhouse``'s pinned dependencies, built the first time."""
    final = IMAGES_DIR / f"runtime-deps-{layer_key(image, wheelhouse)}"
    if (final / "ready").exists():
        return final / "layer"
    with locked(final.parent / f"{final.name}.lock"):
        if (final / "ready").exists():  # another run built it while we waited
            return final / "layer"
        tmp = final.parent / f"{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        try:
            _build(tmp, image, wheelhouse)
        except BaseException:
            _unmount_all(tmp)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        (tmp / "ready").write_text("")
        tmp.rename(final)
    return final / "layer"


def _build(tmp: Path, image: Path, wheelhouse: Path) -> None:
    layer, work, root = tmp / "layer", tmp / "work", tmp / "root"
    for d in (layer, work, root):
        d.mkdir(parents=True)
    _mount(["-t", "overlay", "overlay", "-o", f"lowerdir={image},upperdir={layer},workdir={work}", str(root)])
    try:
        _mount(["-t", "proc", "proc", str(root / "proc")])
        _mount(["--bind", "/dev", str(root / "dev")])
        stage = root / _STAGE
        stage.mkdir(parents=True)
        wheels = dependency_wheels(wheelhouse)
        for wheel in wheels:
            shutil.copyfile(wheel, stage / wheel.name)
        pins = [line for line in (wheelhouse / "requirements.txt").read_text().splitlines() if line.strip()]
        (stage / "requirements.txt").write_text("".join(f"{p}\n" for p in pins if not p.startswith("calque==")))
        _fill(root)
        shutil.rmtree(stage)
    finally:
        _unmount_all(tmp)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)


def _fill(root: Path) -> None:
    """The role's own two steps, as root in the image: ``python3 -m venv`` and pip with no index."""
    pip = [
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
    for argv in (["/usr/bin/python3", "-m", "venv", VENV], pip):
        r = subprocess.run(
            ["chroot", str(root), *argv],
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LC_ALL": "C.UTF-8"},
        )
        if r.returncode != 0:
            raise LayerError(f"{' '.join(argv)} in the image failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")


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
