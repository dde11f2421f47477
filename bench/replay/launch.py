"""Starting the institution on this machine (as root): one Unix user and group per lab, a private
munged (the hosts sign their nudges), one real ``calque session serve`` per host on a simulated GPU,
and a real ``calque session broker`` over their unix sockets. Every part a separate process."""

from __future__ import annotations

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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .institution import CARDS, Shape
from .mapping import Window

CLI = "import sys; sys.argv[0] = 'calque'; from calque.cli.main import main; main()"
START_S = 60.0  # a daemon that does not answer in this long on a loaded 2-core machine is broken


@dataclass(frozen=True)
class LabUser:
    lab: str
    name: str
    group: str
    uid: int
    gid: int


@dataclass
class Running:
    dir: Path
    broker_socket: Path
    procs: list[subprocess.Popen[bytes]]
    hosts: dict[str, Path]  # each host's directory: its gpus.json and audit.jsonl


@contextmanager
def lab_users(labs: list[str]) -> Iterator[dict[str, LabUser]]:
    """One user per lab, in a group of the lab's own (the broker finds a caller's lab by its groups)."""
    tag = secrets.token_hex(3)
    made: dict[str, LabUser] = {}
    try:
        for lab in labs:
            name, group = f"rp{tag}{lab[:6]}", f"rp{tag}-{lab}"
            subprocess.run(["groupadd", group], check=True, capture_output=True)
            subprocess.run(["useradd", "--no-create-home", "--user-group", "--groups", group, name], check=True)
            pw = pwd.getpwnam(name)
            made[lab] = LabUser(lab, name, group, pw.pw_uid, pw.pw_gid)
        yield made
    finally:
        for u in made.values():
            subprocess.run(["userdel", u.name], capture_output=True)
            subprocess.run(["groupdel", u.group], capture_output=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CLI, *args], stdout=subprocess.DEVNULL, stderr=log.open("wb"), start_new_session=True
    )


def _answers(sock: Path, what: str) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(sock))
                s.sendall(b'{"version": 1, "op": "ping", "args": {}}\n')
                if b'"ok":true' in s.recv(4096).replace(b" ", b""):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{what} did not answer in {START_S:g} s (its log is under the replay's directory)")


def _munged(m: Path) -> Path:
    m.mkdir(mode=0o755)
    key = m / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    args = [f"--key-file={key}", f"--socket={m / 'sock'}", f"--log-file={m / 'log'}", f"--pid-file={m / 'pid'}"]
    subprocess.run(["munged", "--force", *args, f"--seed-file={m / 'seed'}"], check=True, timeout=30)
    return m / "sock"


def _host(d: Path, name: str, port: int, munge: Path, idle: dict[str, Any] | None) -> subprocess.Popen[bytes]:
    from calque.gpu.sim import SimGpu

    h = d / name
    h.mkdir(mode=0o755)
    sim = SimGpu.create(h / "gpus.json", ["A100-40GB"] * len(CARDS), mig=True, root=h / "root")
    for i, card in enumerate(CARDS):
        sim.create_instances(i, list(card))
    for p in [h / "root", *(h / "root").rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)
    cfg = {
        "version": 1,
        "socket": str(h / "s.sock"),
        "db": str(h / "state/sessions.db"),
        "audit_log": str(h / "audit.jsonl"),
        "gpu_backend": "sim",
        "sim_state": str(h / "gpus.json"),
        "policy": {"default": {"max_sessions": 1000, "max_ttl": "8h"}},
        "max_connections_per_uid": 1024,
        "host_name": name,
        "broker_nudge": f"127.0.0.1:{port}",
        "munge_socket": str(munge),
    }
    if idle is not None:
        cfg["idle"] = idle
    (h / "session.yaml").write_text(yaml.safe_dump(cfg))
    return _spawn(["session", "serve", "--config", str(h / "session.yaml")], h / "daemon.log")


@contextmanager
def institution(shape: Shape, window: Window, policy: str, users: dict[str, LabUser]) -> Iterator[Running]:
    d = Path(tempfile.mkdtemp(prefix=f"calque-replay-{policy}-", dir="/tmp"))
    d.chmod(0o755)
    port = _free_port()
    munge = _munged(d / "munge")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        names = [f"host{i + 1}" for i in range(shape.hosts)]
        procs += [_host(d, n, port, munge, shape.idle_rule(window, policy)) for n in names]
        for n in names:
            _answers(d / n / "s.sock", f"host daemon {n}")
        b = d / "broker"
        b.mkdir(mode=0o755)
        doc = shape.institution_doc(policy, {lab: u.group for lab, u in users.items()})
        doc["broker"] = {"name": "front", "address": "127.0.0.1", "port": port}
        (b / "institution.yaml").write_text(yaml.safe_dump(doc))
        bcfg = {
            "version": 1,
            "socket": str(b / "broker.sock"),
            "db": str(b / "state/broker.db"),
            "tcp_addr": "127.0.0.1",
            "tcp_port": port,
            "local_hosts": {n: str(d / n / "s.sock") for n in names},
            "institution": str(b / "institution.yaml"),
            "munge_socket": str(munge),
            "audit_log": str(b / "audit/broker-audit.jsonl"),
            "queue": shape.queue_rules(window, policy),
            # grants follow a check-in by the host's nudge; the poll is the backstop (5 s is an hour of trace)
            "poll_every": 1.0,
            "max_connections": 4096,
            "max_connections_per_uid": 4096,
            "max_unread_per_source": 4096,
            "max_unread": 8192,
        }
        (b / "broker.yaml").write_text(yaml.safe_dump(bcfg))
        procs.append(_spawn(["session", "broker", "--config", str(b / "broker.yaml")], b / "broker.log"))
        _answers(b / "broker.sock", "the broker")
        yield Running(d, b / "broker.sock", procs, {n: d / n for n in names})
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        subprocess.run(["munged", "--stop", f"--socket={munge}"], capture_output=True, timeout=30)
        shutil.rmtree(d, ignore_errors=True)
