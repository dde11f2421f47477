"""Running molecule scenarios of calque.gpu the one way both people and pytest do.

molecule keys its working ("ephemeral") directory by the collection folder's name alone, so two
checkouts running the same scenario would share it (and each other's inventories). Every run here
gets its own under this checkout's build/hosts/molecule/<scenario>.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from .fleet import Fleet
from .paths import HOSTS_DIR, REPO

# test_molecule.py's test of one scenario (conftest.py runs its scenario in the background).
SCENARIO_TEST = "test_molecule_scenario_converges_idempotently_and_verifies"
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


def run_molecule(
    scenario: str,
    args: list[str],
    *,
    log: Path | None = None,
    timeout: float | None = None,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> int:
    """``molecule <args> -s <scenario>`` from the collection's root; its output to ``log`` (else the
    terminal). A run that outlives ``timeout`` is killed with its process group. Whatever the
    outcome of a ``test``, the scenario's hosts are torn down afterwards. ``started`` gets the
    process (so a caller can end its process group early)."""
    cmd = [str(REPO / ".venv" / "bin" / "molecule"), *args, "-s", scenario]
    if args[:1] == ["test"]:
        # A test starts from nothing: a killed run's state would say "created" and skip create.
        shutil.rmtree(HOSTS_DIR / "molecule" / scenario, ignore_errors=True)
    out = log.open("w") if log else None
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=COLLECTION,
            env=molecule_env(scenario),
            # Its own stdin: an ssh elsewhere in the session may have made the session's non-blocking,
            # and molecule's first step (ansible-playbook --version) then exits 1.
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
        )
        if started:
            started(proc)
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


class MoleculeRuns:
    """``molecule test`` of some scenarios, one after another in a thread, while the test session
    does something else meanwhile (pytest runs the e2e then): both spend much of their time waiting
    on ssh round trips and systemd, and one alone keeps about one of this machine's two cores busy.
    At most one scenario runs at a time, so at most two runs of hosts are up at once."""

    def __init__(self, names: list[str], log_dir: Path, timeout: float) -> None:
        self.names, self.log_dir, self.timeout = names, log_dir, timeout
        self._rc: dict[str, int] = {}
        self._done = {n: threading.Event() for n in names}
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name="molecule-runs", daemon=True)

    def log(self, name: str) -> Path:
        return self.log_dir / f"molecule-{name}.log"

    def start(self) -> MoleculeRuns:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.names:
            self._thread.start()
        return self

    def _run(self) -> None:
        for name in self.names:
            try:
                if not self._stop.is_set():
                    self._rc[name] = run_molecule(
                        name, ["test"], log=self.log(name), timeout=self.timeout, started=self._started
                    )
            except Exception as e:  # reported by the scenario's test, never lost in the thread
                self.log(name).write_text(f"molecule test -s {name} could not run: {e!r}\n")
                self._rc[name] = -1
            finally:
                self._done[name].set()

    def _started(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    def wait(self, name: str) -> int:
        """The scenario's exit status, once it has run (-1: it could not run; see its log)."""
        if name not in self._done:
            raise KeyError(f"scenario {name!r} is not among this session's: {self.names}")
        if not self._done[name].wait(self.timeout * (self.names.index(name) + 1) + 60):
            raise TimeoutError(f"molecule test -s {name} did not finish")
        return self._rc.get(name, -1)

    def close(self) -> None:
        """Start no further scenario; end the one running (its hosts are torn down as it ends)."""
        self._stop.set()
        if self._thread.is_alive() and self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
        if self._thread.is_alive():
            self._thread.join(120)
