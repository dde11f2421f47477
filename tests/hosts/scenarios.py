"""Running molecule scenarios of calque.gpu the one way both people and pytest do.

molecule keys its working ("ephemeral") directory by the collection folder's name alone, so two
checkouts running the same scenario would share it (and each other's inventories). Every run here
gets its own, build/hosts/molecule/<scenario>/state: one level down, because molecule removes the
ephemeral directory's *parent* when a scenario ends, which must not be shared by scenarios that run
at the same time.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from .fleet import Fleet
from .paths import HOSTS_DIR, REPO

try:  # under pytest (tests/ on sys.path) ...
    from support.timings import span
except ImportError:  # ... or `python -m tests.hosts` from the repository root
    from tests.support.timings import span

# test_molecule.py's test of one scenario (conftest.py runs its scenario in the background).
SCENARIO_TEST = "test_molecule_scenario_converges_idempotently_and_verifies"
COLLECTION = REPO / "collections" / "ansible_collections" / "calque" / "gpu"
MOLECULE_DIR = COLLECTION / "extensions" / "molecule"


def scenarios() -> list[str]:
    return sorted(p.parent.name for p in MOLECULE_DIR.glob("*/molecule.yml"))


def roles() -> list[str]:
    d = COLLECTION / "roles"
    return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []


def ephemeral_dir(scenario: str) -> Path:
    return HOSTS_DIR / "molecule" / scenario / "state"


def molecule_env(scenario: str) -> dict[str, str]:
    venv_bin = REPO / ".venv" / "bin"
    return {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "MOLECULE_EPHEMERAL_DIRECTORY": str(ephemeral_dir(scenario)),
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
            with span("molecule", f"{scenario}: molecule {' '.join(args)}"):
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
    """``molecule test`` of some scenarios in background threads, at most ``parallel`` at a time, while
    the test session does something else meanwhile (pytest runs the e2e then): all of them spend
    most of their time waiting on ssh round trips and systemd. Each scenario boots its own run of
    hosts (``mol-<scenario>``), so runs never share a host."""

    def __init__(self, names: list[str], log_dir: Path, timeout: float, parallel: int = 2) -> None:
        self.names, self.log_dir, self.timeout = names, log_dir, timeout
        self._rc: dict[str, int] = {}
        self._done = {n: threading.Event() for n in names}
        self._stop = threading.Event()
        self._queue = list(names)
        self._lock = threading.Lock()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._threads = [
            threading.Thread(target=self._run, name=f"molecule-runs-{i}", daemon=True)
            for i in range(max(1, min(parallel, len(names))))
        ]

    def log(self, name: str) -> Path:
        return self.log_dir / f"molecule-{name}.log"

    def start(self) -> MoleculeRuns:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.names:
            for t in self._threads:
                t.start()
        return self

    def _next(self) -> str | None:
        with self._lock:
            return None if self._stop.is_set() or not self._queue else self._queue.pop(0)

    def _run(self) -> None:
        while (name := self._next()) is not None:
            try:
                self._rc[name] = run_molecule(
                    name,
                    ["test"],
                    log=self.log(name),
                    timeout=self.timeout,
                    started=functools.partial(self._started, name),
                )
            except Exception as e:  # reported by the scenario's test, never lost in the thread
                self.log(name).write_text(f"molecule test -s {name} could not run: {e!r}\n")
                self._rc[name] = -1
            finally:
                self._done[name].set()
        for name in self._queue:  # stopped: the ones never started are done, with no result
            self._done[name].set()

    def _started(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        self._procs[name] = proc

    def wait(self, name: str) -> int:
        """The scenario's exit status, once it has run (-1: it could not run; see its log)."""
        if name not in self._done:
            raise KeyError(f"scenario {name!r} is not among this session's: {self.names}")
        if not self._done[name].wait(self.timeout * (self.names.index(name) + 1) + 60):
            raise TimeoutError(f"molecule test -s {name} did not finish")
        return self._rc.get(name, -1)

    def close(self) -> None:
        """Start no further scenario; end the ones running (their hosts are torn down as they end)."""
        self._stop.set()
        for proc in list(self._procs.values()):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for t in self._threads:
            if t.is_alive():
                t.join(120)
