"""Fixtures of the session tests: real Unix users, a real daemon process, a simulated GPU host.

Everything lives in a directory under /tmp that other users can traverse (pytest's own tmp_path is
0700), because clients run as the test users. Users and groups are removed afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from calque.gpu.sim import SimGpu
from calque.models import MigDevice
from calque.session.client.connection import SessionClient
from support.waits import HANG_S, pause

from .munged import munged  # noqa: F401 (a fixture of the cross-host tests)

REPO = Path(__file__).resolve().parents[2]
VENV_PY = REPO / ".venv/bin/python"
# The labs' Unix groups of the ledger and budget tests, one pair per test process: side by side,
# two tests creating (and at teardown deleting) one group name took it from under each other.
LAB_A, LAB_B = f"cqla{os.getpid()}", f"cqlb{os.getpid()}"
SITE = next((REPO / ".venv/lib").glob("python3*/site-packages"))
CLI = "import sys; sys.argv[0] = 'calque'; from calque.cli.main import main; main()"
# The stand-in control daemon the GPU tests use (a real process on a real socket), for each MPS GPU.
MPS_CONTROL = REPO / "tests/gpu/bin/nvidia-cuda-mps-control"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="session tests create Unix users: run as root")


@dataclass
class User:
    name: str
    uid: int
    gid: int


@dataclass
class Host:
    """A temporary host: simulated GPUs, a config, a daemon, and helpers to act as users."""

    dir: Path
    sim: SimGpu
    migs: list[MigDevice]
    python: list[str]
    env: dict[str, str]
    config: dict[str, Any] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    mps_daemons: dict[int, int] = field(default_factory=dict)  # GPU index -> its control daemon's pid

    @property
    def socket(self) -> Path:
        return self.dir / "session.sock"

    @property
    def audit(self) -> Path:
        return self.dir / "audit.jsonl"

    def client(self, **kw: Any) -> SessionClient:
        return SessionClient(self.socket, **kw)

    def write_config(self, **overrides: Any) -> Path:
        cfg: dict[str, Any] = {
            "version": 1,
            "socket": str(self.socket),
            "db": str(self.dir / "state/sessions.db"),
            "audit_log": str(self.audit),
            "gpu_backend": "sim",
            "sim_state": str(self.sim.state_path),
            "mps_pipe_root": str(self.dir / "mps"),
            "mps_log_root": str(self.dir / "mps-log"),
            "request_timeout": 1.0,
            "notice_before": 60,
            "kill_grace": 0.5,
            "policy": {"default": {"max_sessions": 100, "max_ttl": "8h"}},
            # CALQUE_TEST_SESSION_PROCESSES=2 runs every test against a multi-process daemon.
            "processes": int(os.environ.get("CALQUE_TEST_SESSION_PROCESSES", "1")),
        }
        cfg.update(self.config)
        cfg.update(overrides)
        path = self.dir / "session.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def mps_pipe(self, gpu: int) -> Path:
        return self.dir / "mps" / f"gpu{gpu}"

    def start_mps(self, gpu: int) -> int:
        """The GPU's MPS control daemon (the stand-in, as ``calque gpu mps start`` runs it): listening on
        its pipe directory's ``control`` socket when this returns; its pid."""
        pipe, logs = self.mps_pipe(gpu), self.dir / "mps-log" / f"gpu{gpu}"
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
        subprocess.run(
            [sys.executable, str(MPS_CONTROL), "-d"], env=env, check=True, capture_output=True, timeout=HANG_S
        )
        pidfile = pipe / "nvidia-cuda-mps-control.pid"  # written by the daemonised child, just after
        assert wait_for(lambda: pidfile.exists() and pidfile.read_text().strip().isdigit()), pidfile
        self.mps_daemons[gpu] = int(pidfile.read_text())
        return self.mps_daemons[gpu]

    def kill_mps(self, gpu: int) -> None:
        """SIGKILL the GPU's control daemon, as a crash would: its socket file stays, nothing listens."""
        pid = self.mps_daemons.pop(gpu)
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid)), pid

    def start(self, mps: bool = True, **overrides: Any) -> None:
        """Start the daemon; first, with ``mps``, a control daemon for each MPS GPU of the config."""
        path = self.write_config(**overrides)
        if mps:
            for m in yaml.safe_load(path.read_text()).get("mps") or []:
                if m["gpu"] not in self.mps_daemons and "pipe_directory" not in m:
                    self.start_mps(m["gpu"])
        log = (self.dir / "daemon.log").open("ab")
        self.proc = subprocess.Popen(
            [str(VENV_PY), "-c", CLI, "session", "serve", "--config", str(path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited: {(self.dir / 'daemon.log').read_text()[-3000:]}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket))
                    s.sendall(b'{"version": 1, "op": "ping"}\n')
                    if b'"ok":true' in s.recv(4096):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"daemon did not answer in {HANG_S:g} s (a hang)")

    def kill9(self) -> None:
        """SIGKILL the daemon and its worker processes at once (its own process group, as systemd
        would kill the unit's cgroup)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(HANG_S)
        self.proc = None

    def stop_mps(self) -> None:
        for gpu in list(self.mps_daemons):
            with contextlib.suppress(ProcessLookupError):
                self.kill_mps(gpu)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def cli(
        self, user: User | None, *args: str, check: bool = False, timeout: float = HANG_S
    ) -> subprocess.CompletedProcess[str]:
        """``calque ARGS`` as ``user`` (root when None), against this host's socket."""
        env = {**self.env, "CALQUE_SESSION_SOCKET": str(self.socket)}
        cmd = [*self.python, "-c", CLI, *args]
        return self.run_as(user, cmd, env=env, check=check, timeout=timeout)

    def run_as(
        self,
        user: User | None,
        cmd: list[str],
        env: dict[str, str] | None = None,
        check: bool = False,
        timeout: float = HANG_S,
    ) -> subprocess.CompletedProcess[str]:
        full = as_user(user, cmd)
        res = subprocess.run(full, env=env or self.env, capture_output=True, text=True, timeout=timeout, cwd=self.dir)
        if check and res.returncode != 0:
            raise AssertionError(f"{cmd} as {user} exited {res.returncode}: {res.stderr}")
        return res

    def audit_events(self) -> list[dict[str, Any]]:
        if not self.audit.exists():
            return []
        return [json.loads(line) for line in self.audit.read_text().splitlines() if line.strip()]


def as_user(user: User | None, cmd: list[str]) -> list[str]:
    if user is None:
        return cmd
    return ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", "--", *cmd]


@pytest.fixture
def make_user() -> Iterator[Callable[..., User]]:
    made: list[str] = []
    groups: list[str] = []

    def make(groups_: list[str] | None = None) -> User:
        name = "cq" + secrets.token_hex(4)
        for g in groups_ or []:
            if g not in groups:
                subprocess.run(["groupadd", g], check=True, capture_output=True)
                groups.append(g)
        cmd = ["useradd", "--no-create-home", "--shell", "/bin/bash", "--user-group"]
        if groups_:
            cmd += ["--groups", ",".join(groups_)]
        subprocess.run([*cmd, name], check=True, capture_output=True)
        made.append(name)
        pw = pwd.getpwnam(name)
        return User(name, pw.pw_uid, pw.pw_gid)

    yield make
    for name in made:
        subprocess.run(["userdel", name], capture_output=True)
    for g in groups:
        subprocess.run(["groupdel", g], capture_output=True)


def _user_python(probe: User | None) -> tuple[list[str], dict[str, str]]:
    """The venv's python when other users can run it; else the system python with the venv's packages.

    On this machine the venv's base interpreter lives under /root (mode 0700), so other users cannot
    execute it; the same-minor system python with PYTHONPATH reaches the same code and packages.
    """
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}
    if probe is not None:
        # Through a shell: a shell's exec is how users will run it (setpriv's own exec behaves differently here).
        probe_cmd = ["/bin/sh", "-c", f"exec {VENV_PY} -c 'import calque'"]
        ok = subprocess.run(as_user(probe, probe_cmd), capture_output=True).returncode == 0
        if ok:
            return [str(VENV_PY)], env
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    sys_py = shutil.which(ver, path="/usr/bin:/usr/local/bin")
    if sys_py is None:
        pytest.skip(f"no {ver} that other users can run (the venv's interpreter is unreachable to them)")
    env["PYTHONPATH"] = f"{REPO / 'runtime'}:{SITE}"
    return [sys_py], env


@pytest.fixture
def host(make_user: Callable[..., User]) -> Iterator[Host]:
    """An A100-40GB host with 7 x 1g.5gb MIG slices plus an L4 with MPS slots; daemon not started."""
    d = Path(tempfile.mkdtemp(prefix="calque-session-", dir="/tmp"))
    d.chmod(0o755)
    sim = SimGpu.create(d / "gpus.json", ["A100-40GB", "L4-24GB"], mig=True, root=d / "root")
    migs = sim.create_instances(0, ["1g.5gb"] * 7)
    for p in [d / "root", *(d / "root").rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)
    probe = make_user()
    python, env = _user_python(probe)
    h = Host(dir=d, sim=sim, migs=migs, python=python, env=env)
    h.config["mps"] = [{"gpu": 1, "slots": 2, "active_thread_percentage": 50, "pinned_mem_limit_mib": 8192}]
    try:
        yield h
    finally:
        h.stop()
        h.stop_mps()
        shutil.rmtree(d, ignore_errors=True)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def wait_for(pred: Callable[[], bool], timeout: float = HANG_S, every: float = 0.05) -> bool:
    """Whether ``pred()`` came true, polled from every ``every`` s on (``support.waits.pause``: slower as
    the check costs more and the wait goes on): the event decides, and only a hang (``HANG_S``,
    support/waits.py) makes it False, for the caller's assert to say what never happened. A shorter
    ``timeout`` is for a time bound that is itself what a test checks, never for a wait."""
    start = time.monotonic()
    while (asked := time.monotonic()) < start + timeout:
        if pred():
            return True
        now = time.monotonic()
        time.sleep(min(pause(every, now - asked, now - start), max(0.0, start + timeout - now)))
    return pred()
