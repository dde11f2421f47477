"""The wheelhouse the ``runtime`` role installs calque from on a host (hosts reach no package index).

Layout (ISSUE9-SHARED): exactly one ``calque-<version>-py3-none-any.whl``, its pinned dependency
wheels, ``requirements.txt`` and ``SHA256SUMS``; and ``notebooks/`` (the ``notebooks`` extra's wheels,
indexed alike) for the hosts that run the hub or notebooks (the estate's front door and teach-a).
Built once per content of the runtime (keyed by pyproject.toml, constraints.txt and the files under
runtime/calque) and reused by every run. Uses ``calque runtime wheelhouse --notebooks`` where this
checkout has it, else ``pip wheel`` with the constraints (no notebooks/ then).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .paths import HOSTS_DIR, REPO, locked

WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def content_key() -> str:
    h = hashlib.sha256()
    for f in (REPO / "pyproject.toml", REPO / "constraints.txt"):
        h.update(f.read_bytes())
    for f in sorted((REPO / "runtime" / "calque").rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(REPO)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def ensure_wheelhouse() -> Path:
    """The wheelhouse for this checkout's runtime, built the first time."""
    out = HOSTS_DIR / "wheelhouse" / content_key()
    if (out / "SHA256SUMS").exists():
        return out
    with locked(out.parent / f"{out.name}.lock"):
        if (out / "SHA256SUMS").exists():
            return out
        tmp = out.parent / f"{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            _build(tmp)
            write_index(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def _build(dest: Path) -> None:
    bindir = Path(sys.executable).parent
    calque = bindir / "calque"
    help_text = (
        subprocess.run([str(calque), "runtime", "wheelhouse", "--help"], capture_output=True, text=True, check=False)
        if calque.exists()
        else None
    )
    has_cmd = help_text is not None and help_text.returncode == 0 and "--notebooks" in help_text.stdout
    if has_cmd:
        cmd = [str(calque), "runtime", "wheelhouse", "--notebooks", str(dest)]
    else:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--wheel-dir",
            str(dest),
            "-c",
            str(REPO / "constraints.txt"),
            str(REPO),
        ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"building the wheelhouse failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")


def write_index(dest: Path) -> None:
    """requirements.txt pinning every wheel present, and SHA256SUMS, unless the builder wrote them."""
    wheels = sorted(dest.glob("*.whl"))
    calques = [w for w in wheels if w.name.startswith("calque-")]
    if len(calques) != 1 or not calques[0].name.endswith("-py3-none-any.whl"):
        raise RuntimeError(f"a wheelhouse needs exactly one calque-<version>-py3-none-any.whl, found {calques}")
    if not (dest / "requirements.txt").exists():
        pins = []
        for w in wheels:
            m = WHEEL_RE.match(w.name)
            if not m:
                raise RuntimeError(f"cannot read name and version of wheel {w.name}")
            pins.append(f"{m['name']}=={m['version']}")
        (dest / "requirements.txt").write_text("\n".join(pins) + "\n")
    if not (dest / "SHA256SUMS").exists():
        sums = [f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}" for w in wheels]
        (dest / "SHA256SUMS").write_text("\n".join(sums) + "\n")
