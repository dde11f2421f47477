"""An institution on this machine: several real session daemons (each a simulated GPU host with its
own registry and socket) and a real broker process over them, with a broker config of its own.

The hosts are reached by the broker through their unix sockets (the local path, ``broker/local.py``);
the broker is root, the daemons' default broker service user, so each call names the user it acts for.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from calque.gpu.sim import SimGpu
from support.waits import HANG_S

from .conftest import CLI, VENV_PY, Host, User, _user_python
from .munged import MUNGED, Munged, start_munged, stop_munged

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A port free for both UDP and TCP: the broker takes nudges (UDP) and researchers (TCP) on one port."""
    for _ in range(50):
        with (
            socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp,
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp,
        ):
            tcp.bind(("127.0.0.1", 0))
            port = int(tcp.getsockname()[1])
            try:
                udp.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no port free for both TCP and UDP on 127.0.0.1 in 50 tries")


@dataclass
class Broker:
    dir: Path
    hosts: dict[str, Host]
    python: list[str]
    env: dict[str, str]
    port: int
    config: dict[str, Any] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    # The institution's munged (None where munge is not installed): the hosts sign their nudges with it
    # and the broker decodes them; a test's own munged for the broker takes its key (``munge_key``).
    munged: Munged | None = None

    def munge_key(self) -> bytes | None:
        return self.munged.key.read_bytes() if self.munged is not None else None

    @property
    def socket(self) -> Path:
        return self.dir / "broker.sock"

    @property
    def db(self) -> Path:
        return self.dir / "state/broker.db"

    def write_config(self) -> Path:
        cfg: dict[str, Any] = {
            "version": 1,
            "socket": str(self.socket),
            "db": str(self.db),
            "tcp_addr": "127.0.0.1",
            "tcp_port": self.port,
            "local_hosts": {name: str(h.socket) for name, h in self.hosts.items()},
            "institution": str(self.dir / "institution.yaml"),
            "audit_log": str(self.dir / "audit/broker-audit.jsonl"),
            "poll_every": 2.0,
            "queue": {"max_queued_per_user": 20, "claim_window": "5s"},
        }
        if self.munged is not None:  # where the hosts' signed nudges are decoded
            cfg["munge_socket"] = str(self.munged.socket)
        cfg.update(self.config)
        path = self.dir / "broker.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def write_institution(self, **doc: Any) -> None:
        """``institution.yaml`` for the broker (labs; no remote hosts: they are all on this machine)."""
        (self.dir / "institution.yaml").write_text(yaml.safe_dump({"version": 1, **doc}))

    def start(self) -> None:
        path = self.write_config()
        log = (self.dir / "broker.log").open("ab")
        self.proc = subprocess.Popen(
            [str(VENV_PY), "-c", CLI, "session", "broker", "--config", str(path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"broker exited: {self.log()[-3000:]}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket))
                    s.sendall(b'{"version": 1, "op": "ping"}\n')
                    if b'"ok":true' in s.recv(4096):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"broker did not answer in {HANG_S:g} s (a hang)")

    def log(self) -> str:
        p = self.dir / "broker.log"
        return p.read_text() if p.exists() else ""

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(HANG_S)
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def cli_env(self) -> dict[str, str]:
        return {**self.env, "CALQUE_BROKER_SOCKET": str(self.socket)}

    def cli(self, user: User | None, *args: str, timeout: float = HANG_S) -> subprocess.CompletedProcess[str]:
        """``calque ARGS`` as ``user`` (root when None), against the broker's socket."""
        from .conftest import as_user

        cmd = as_user(user, [*self.python, "-c", CLI, *args])
        return subprocess.run(cmd, env=self.cli_env(), capture_output=True, text=True, timeout=timeout, cwd=self.dir)

    def popen(self, user: User, *args: str) -> subprocess.Popen[str]:
        """``calque ARGS`` as ``user`` in the background (a waiting checkout)."""
        from .conftest import as_user

        cmd = as_user(user, [*self.python, "-c", CLI, *args])
        return subprocess.Popen(
            cmd, env=self.cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.dir
        )

    def popen_script(self, user: User, script: str, *args: str) -> subprocess.Popen[str]:
        """A Python script as ``user`` in the background, with the client's modules importable."""
        from .conftest import as_user

        cmd = as_user(user, [*self.python, "-c", script, *args])
        env = {**self.cli_env(), "PYTHONPATH": f"{REPO / 'runtime'}:{self.env.get('PYTHONPATH', '')}"}
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.dir)

    def anywhere(self, user: User, *extra: str) -> dict[str, Any]:
        res = self.cli(user, "session", "checkout", "--anywhere", "--ttl", "1h", "--json", *extra)
        assert res.returncode == 0, res.stderr
        grant: dict[str, Any] = json.loads(res.stdout)
        return grant

    def queue_all(self) -> list[dict[str, Any]]:
        res = self.cli(None, "session", "queue", "--all", "--json")
        assert res.returncode == 0, res.stderr
        entries: list[dict[str, Any]] = json.loads(res.stdout)
        return entries


def make_host(
    root: Path,
    name: str,
    slices: int,
    probe: User,
    port: int,
    munged: Munged | None = None,
    gpus: int = 1,
    mig: tuple[str, str] = ("A100-40GB", "1g.5gb"),
) -> Host:
    """A host of ``slices`` MIG slices of ``mig``'s profile on its card (1g.5gb on an A100 unless
    told), on each of ``gpus`` such cards; ``-N``: an L4 with N MPS slots instead."""
    d = root / name
    d.mkdir(mode=0o755)
    card, profile = mig
    cards = [card if slices > 0 else "L4-24GB"] * (gpus if slices > 0 else 1)
    sim = SimGpu.create(d / "gpus.json", cards, mig=slices > 0, root=d / "root")
    migs = [m for i in range(len(cards)) for m in sim.create_instances(i, [profile] * slices)] if slices > 0 else []
    for p in [d / "root", *(d / "root").rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)
    python, env = _user_python(probe)
    h = Host(dir=d, sim=sim, migs=migs, python=python, env=env)
    h.config.update({"host_name": name, "broker_nudge": f"127.0.0.1:{port}"})
    if munged is not None:  # its nudges signed by the institution's munged
        h.config["munge_socket"] = str(munged.socket)
    if slices < 0:
        h.config["mps"] = [{"gpu": 0, "slots": -slices, "active_thread_percentage": 50, "pinned_mem_limit_mib": 8192}]
    return h


@contextmanager
def institution(
    make_user: Callable[..., User],
    slices: dict[str, int],
    gpus: int = 1,
    mig: tuple[str, str] = ("A100-40GB", "1g.5gb"),
) -> Iterator[Broker]:
    """Hosts named and sized by ``slices`` (name -> MIG slices of ``mig``'s profile, 1g.5gb unless told,
    on each of ``gpus`` of its cards), started; a broker over them, not started."""
    root = Path(tempfile.mkdtemp(prefix="calque-inst-", dir="/tmp"))
    root.chmod(0o755)
    probe = make_user()
    port = free_port()
    munged = None
    if MUNGED is not None:
        (root / "munge-institution").mkdir()
        munged = start_munged(root / "munge-institution")
    hosts = {name: make_host(root, name, n, probe, port, munged, gpus, mig) for name, n in slices.items()}
    python, env = _user_python(probe)
    b = Broker(dir=root / "broker", hosts=hosts, python=python, env=env, port=port, munged=munged)
    b.dir.mkdir(mode=0o755)
    try:
        for h in hosts.values():
            h.start()
        yield b
    finally:
        b.stop()
        for h in hosts.values():
            h.stop()
        if munged is not None:
            stop_munged(munged)
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def over_tcp(broker: Broker, labs: list[dict[str, Any]] | None = None, hub: str | None = None) -> Iterator[None]:
    """The broker reaching its hosts over TCP with munge instead of their sockets: the broker and the
    hosts each have a munged (one key), ``institution.yaml`` names every host at a loopback port, plus
    hostZ where nothing listens; the hosts are restarted listening, the broker configured (not started)."""
    (broker.dir / "munge").mkdir()
    (broker.dir / "munge-hosts").mkdir()
    brokers_munged = start_munged(broker.dir / "munge", key=broker.munge_key())
    hosts_munged = start_munged(broker.dir / "munge-hosts", key=brokers_munged.key.read_bytes())
    try:
        ports = {name: free_port() for name in broker.hosts}
        inst = broker.dir / "institution.yaml"
        doc: dict[str, Any] = {
            "version": 1,
            # hostZ is in the file but nothing listens there: refused connections, skipped (NotSent)
            "hosts": [{"name": n, "address": "127.0.0.1", "port": p} for n, p in ports.items()]
            + [{"name": "hostZ", "address": "127.0.0.1", "port": free_port()}],
            "broker": {"address": "127.0.0.1", "port": broker.port, "service_user": "root"},
        }
        if labs is not None:
            doc["labs"] = labs
        if hub is not None:  # the institution's JupyterHub runs as this user (test_jupyterhub_spawner.py)
            doc["hub"] = {"service_user": hub}
        inst.write_text(yaml.safe_dump(doc))
        inst.chmod(0o644)
        for name, h in broker.hosts.items():
            h.stop()
            # institution.yaml names the broker: a plain checkout on a host goes through it, over TCP
            # with the researcher's own munge credential (its munged: the hosts', with the same key).
            h.env["CALQUE_MUNGE_SOCKET"] = str(hosts_munged.socket)
            h.start(
                listen_tcp={"address": "127.0.0.1", "port": ports[name]},
                institution=str(inst),
                munge_socket=str(hosts_munged.socket),
            )
        broker.config.update(local_hosts={}, institution=str(inst), munge_socket=str(brokers_munged.socket))
        yield
    finally:
        broker.stop()
        stop_munged(hosts_munged)
        stop_munged(brokers_munged)


def stand_in_ssh(broker: Broker) -> tuple[dict[str, str], Path]:
    """``ssh -t HOST CMD`` on one machine: CMD run here by sh against HOST's session socket, and the
    call logged. Only the transport is stood in; calque on "HOST" is the real CLI on its real daemon."""
    bin_dir = broker.dir / "bin"
    bin_dir.mkdir(mode=0o755)
    log = broker.dir / "ssh.log"
    log.touch()
    log.chmod(0o666)
    calque = bin_dir / "calque"
    calque.write_text(f'#!/bin/sh\nexec {shlex.join(broker.python)} -c {shlex.quote(CLI)} "$@"\n')
    ssh = bin_dir / "ssh"
    sockets = " ".join(f"{n}={h.socket}" for n, h in broker.hosts.items())
    ssh.write_text(
        "#!/bin/sh\n"
        '[ "$1" = -t ] || exit 97\n'
        f'host=$2; shift 2; echo "-t $host $*" >> {log}\n'
        f'for kv in {sockets}; do [ "${{kv%%=*}}" = "$host" ] && export CALQUE_SESSION_SOCKET="${{kv#*=}}"; done\n'
        'exec sh -c "$*"\n'
    )
    for p in (calque, ssh):
        p.chmod(0o755)
    env = {**broker.cli_env(), "CALQUE_SSH": str(ssh), "PATH": f"{bin_dir}:{broker.env['PATH']}"}
    return env, log
