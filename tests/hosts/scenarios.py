"""Running molecule scenarios of calque.gpu the one way both people and pytest do.

molecule keys its working ("ephemeral") directory by the collection folder's name alone, so two
checkouts running the same scenario would share it (and each other's inventories). Every run here
gets its own under this checkout's build/hosts/molecule/<scenario>.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from .fleet import Fleet
from .paths import HOSTS_DIR, REPO

COLLECTION = REPO / "collections" / "ansible_collections" / "calque" / "gpu"
MOLECULE_DIR = COLLECTION / "extensions" / "molecule"


def scenarios() -> list[str]:
    return sorted(p.parent.name for p in MOLECULE_DIR.glob("*/molecule.yml"))


def roles() -> list[str]:
    d = COLLECTION / "roles"
    return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []


def molecule_env(scenario: str) -> dict[str, str]:
    venv_bin = REPO / ".venv" / "bin"
    return {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "MOLECULE_EPHEMERAL_DIRECTORY": str(HOSTS_DIR / "molecule" / scenario),
        "NO_COLOR": "1",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
    }


def run_molecule(scenario: str, args: list[str], *, log: Path | None = None, timeout: float | None = None) -> int:
    """``molecule <args> -s <scenario>`` from the collection's root; its output to ``log`` (else the
    terminal). A run that outlives ``timeout`` is killed with its process group. Whatever the
    outcome of a ``test``, the scenario's hosts are torn down afterwards."""
    cmd = [str(REPO / ".venv" / "bin" / "molecule"), *args, "-s", scenario]
    out = log.open("w") if log else None
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=COLLECTION,
            env=molecule_env(scenario),
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
    finally:
        if out:
            out.close()
        if args[:1] == ["test"]:
            run = Fleet(f"mol-{scenario}")
            if run.state_file.exists():  # molecule's destroy did not run (timeout) or failed
                run.down()
    return rc
