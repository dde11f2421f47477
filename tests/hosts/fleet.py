"""A run of booted test hosts: namespaces, hosts, ssh material, an inventory, and their teardown.

Everything a run makes is recorded in ``build/hosts/runs/<name>/state.json`` as it is made, so any
process (a pytest finalizer, molecule's destroy playbook, ``down --all`` after a crash) can tear it
down by pid and by name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import netns, procs
from .exits import control_dir_of, track, untrack
from .image import ensure_image, host_public_key
from .machine import BOOT_TIMEOUT, Host, HostError, mounts_under
from .paths import HANG_S, HOSTS_DIR, NETNS_PREFIX, REPO, RUNS_DIR
from .runtime_layer import layers_for
from .shapes import shape as get_shape

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,23}$")
HOST_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
SSH_TIMEOUT = HANG_S  # sshd answering once systemd is up: however loaded the machine, only a hang fails


@dataclass(frozen=True)
class HostSpec:
    name: str
    shape: str = "none"
    groups: tuple[str, ...] = ()
    notebooks: bool = False  # with Fleet.up(runtime_deps=...): boots with the notebooks extra's layer too


@dataclass
class Server:
    name: str
    pid: int
    started: int | None
    log: str


@dataclass
class State:
    name: str
    controller_ns: str
    hosts: list[Host] = field(default_factory=list)
    servers: list[Server] = field(default_factory=list)
    wheelhouse: str | None = None


class Fleet:
    """Booted hosts of one run. ``Fleet(name).up(specs)``; ``down()`` always, even after a failure."""

    def __init__(self, name: str) -> None:
        if not NAME_RE.match(name):
            raise ValueError(f"run name {name!r}: use 1-24 of a-z, 0-9, '-', '_', starting with a letter or digit")
        self.name = name
        self.dir = RUNS_DIR / name
        self.state = State(name=name, controller_ns=f"{NETNS_PREFIX}{name}-c")
        if self.state_file.exists():
            self._load()

    # -- files of the run ---------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def inventory(self) -> Path:
        return self.dir / "inventory.yml"

    @property
    def key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def ssh_config(self) -> Path:
        return self.dir / "ssh_config"

    @property
    def bin(self) -> Path:
        return self.dir / "bin"

    @property
    def control_dir(self) -> Path:
        """ssh's control sockets: a short path under /run, as a unix socket's path must stay under
        108 bytes wherever the checkout lives."""
        return control_dir_of(self.name)

    @property
    def controller_ns(self) -> str:
        return self.state.controller_ns

    @property
    def hosts(self) -> list[Host]:
        return self.state.hosts

    def host(self, name: str) -> Host:
        for h in self.state.hosts:
            if h.name == name:
                return h
        raise KeyError(f"run {self.name} has no host {name!r}; it has {[h.name for h in self.state.hosts]}")

    def _save(self) -> None:
        doc = {
            "name": self.state.name,
            "controller_ns": self.state.controller_ns,
            "wheelhouse": self.state.wheelhouse,
            "hosts": [h.to_dict() for h in self.state.hosts],
            "servers": [s.__dict__ for s in self.state.servers],
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2))
        tmp.replace(self.state_file)

    def _load(self) -> None:
        doc = json.loads(self.state_file.read_text())
        self.state = State(
            name=doc["name"],
            controller_ns=doc["controller_ns"],
            hosts=[Host(**h) for h in doc["hosts"]],
            servers=[Server(**s) for s in doc.get("servers", [])],
            wheelhouse=doc.get("wheelhouse"),
        )

    # -- up -----------------------------------------------------------------------------------------

    def up(
        self,
        specs: list[HostSpec],
        *,
        wheelhouse: Path | None = None,
        runtime_deps: Path | None = None,
        boot_timeout: float = BOOT_TIMEOUT,
    ) -> Fleet:
        """Boot ``specs`` in parallel and wait until each runs systemd and answers ssh.

        ``runtime_deps``: a wheelhouse whose pinned dependencies every host starts with in the runtime
        role's virtualenv (``runtime_layer.py``), for runs that test something other than that install;
        the hosts whose spec says ``notebooks`` start with the notebooks extra there too.
        """
        self._check_specs(specs)
        if self.state_file.exists() or netns.exists(self.controller_ns):
            self.down()  # a stale run of the same name
        self.dir.mkdir(parents=True, exist_ok=True)
        track(self)
        try:
            self.state = State(
                name=self.name, controller_ns=self.controller_ns, wheelhouse=str(wheelhouse or "") or None
            )
            self._save()
            image = ensure_image()
            layers = {n: layers_for(image, runtime_deps, n) for n in sorted({s.notebooks for s in specs})}
            self._ssh_material(specs, image)
            netns.create_controller(self.controller_ns)
            etc_hosts = self._etc_hosts(specs)
            pubkey = (self.dir / "id_ed25519.pub").read_text().strip()
            for i, spec in enumerate(specs):
                host = Host(
                    name=spec.name,
                    shape=spec.shape,
                    groups=list(spec.groups),
                    address=netns.host_address(i),
                    netns=f"{NETNS_PREFIX}{self.name}-{i}",
                    machine=f"{NETNS_PREFIX}{self.name}-{spec.name}".replace("_", "-")[:60],
                    dir=str(self.dir / "hosts" / spec.name),
                )
                self.state.hosts.append(host)
                self._save()  # recorded before anything is made, so a crash here is still torn down
                netns.add_host(self.controller_ns, host.netns, i)
                host.lay_out(image, pubkey, etc_hosts, layers[spec.notebooks])
                host.boot()
                self._save()
            deadline = time.monotonic() + boot_timeout
            for host in self.state.hosts:
                host.wait_booted(deadline)
            self._wait_ssh(time.monotonic() + SSH_TIMEOUT)
            self._write_inventory()
        except BaseException:
            self.down()
            raise
        return self

    def _check_specs(self, specs: list[HostSpec]) -> None:
        if not specs:
            raise ValueError("give at least one host")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"host names must be unique: {names}")
        for s in specs:
            if not HOST_RE.match(s.name):
                raise ValueError(f"host name {s.name!r}: use a-z, 0-9 and '-' (a hostname), at most 31 characters")
            get_shape(s.shape)  # raises with the known shapes

    def _etc_hosts(self, specs: list[HostSpec]) -> str:
        lines = ["127.0.0.1\tlocalhost", f"{netns.CONTROLLER_ADDRESS}\tcontroller"]
        lines += [f"{netns.host_address(i)}\t{s.name}" for i, s in enumerate(specs)]
        return "\n".join(lines) + "\n"

    def _ssh_material(self, specs: list[HostSpec], image: Path) -> None:
        """A key for this run, known_hosts pinning the image's host key, an ssh_config, and wrappers
        that run ssh/sftp/scp in the controller namespace (where the hosts' addresses exist)."""
        self.key.unlink(missing_ok=True)
        (self.dir / "id_ed25519.pub").unlink(missing_ok=True)
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"calque-test-hosts-{self.name}",
                "-f",
                str(self.key),
            ],
            check=True,
            capture_output=True,
        )
        hostkey = host_public_key(image)
        known = [f"{s.name},{netns.host_address(i)} {hostkey}" for i, s in enumerate(specs)]
        (self.dir / "known_hosts").write_text("\n".join(known) + "\n")
        self.control_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        cfg = [line for i, s in enumerate(specs) for line in (f"Host {s.name}", f"  HostName {netns.host_address(i)}")]
        cfg += [
            "Host *",
            "  User root",
            f"  IdentityFile {self.key}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {self.dir / 'known_hosts'}",
            "  StrictHostKeyChecking yes",
            "  ConnectTimeout 10",
            "  ServerAliveInterval 10",
            "  LogLevel ERROR",
            # %r@%h, not %C (40 hex): a unix socket path has 108 bytes, and ssh appends 17 while binding
            f"  ControlPath {self.control_dir}/%r@%h",
            "  ControlMaster auto",
            "  ControlPersist 60",
        ]
        self.ssh_config.write_text("\n".join(cfg) + "\n")
        self.bin.mkdir(exist_ok=True)
        for tool in ("ssh", "sftp", "scp"):
            w = self.bin / tool
            w.write_text(
                "#!/bin/sh\n"
                f"# {tool} to the hosts of test run {self.name}: their addresses exist only in its\n"
                "# controller namespace.\n"
                f'exec ip netns exec {self.controller_ns} /usr/bin/{tool} -F {self.ssh_config} "$@"\n'
            )
            w.chmod(0o755)

    def _wait_ssh(self, deadline: float) -> None:
        for host in self.state.hosts:
            last = ""
            while True:
                try:
                    r = self.ssh(
                        host.name,
                        "true",
                        check=False,
                        timeout=15,
                        options=["-o", "BatchMode=yes", "-o", "ConnectTimeout=3"],
                    )
                except subprocess.TimeoutExpired:  # one slow try (a loaded machine): try again until the deadline
                    last = "ssh took more than 15 s"
                else:
                    if r.returncode == 0:
                        break
                    last = (r.stderr or r.stdout).strip()
                if time.monotonic() > deadline:
                    raise HostError(f"host {host.name}: sshd did not answer on {host.address}: {last}")
                time.sleep(0.3)

    def _write_inventory(self) -> None:
        common: dict[str, Any] = {
            "ansible_user": "root",
            "ansible_private_key_file": str(self.key),
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_executable": str(self.bin / "ssh"),
            "ansible_sftp_executable": str(self.bin / "sftp"),
            "ansible_scp_executable": str(self.bin / "scp"),
            "ansible_control_path_dir": str(self.control_dir),
        }
        if self.state.wheelhouse:
            common["calque_runtime_wheelhouse"] = self.state.wheelhouse
        hosts = {h.name: {"ansible_host": h.address, **get_shape(h.shape).host_vars()} for h in self.state.hosts}
        children: dict[str, Any] = {}
        for h in self.state.hosts:
            for g in h.groups:
                children.setdefault(g, {"hosts": {}})["hosts"][h.name] = None
        doc = {"all": {"vars": common, "hosts": hosts, **({"children": children} if children else {})}}
        header = f"# Test run {self.name} (tests/hosts); reachable only through the ssh wrappers in {self.bin}.\n"
        self.inventory.write_text(header + yaml.safe_dump(doc, sort_keys=False))

    # -- use ----------------------------------------------------------------------------------------

    def ssh(
        self,
        host: str,
        command: str,
        *,
        user: str = "root",
        check: bool = True,
        timeout: float = 120,
        input: str | None = None,
        options: list[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell ``command`` on ``host`` over real ssh from the controller namespace."""
        cmd = [str(self.bin / "ssh"), *(options or []), "-l", user, host, command]
        # Never the session's own stdin: ssh sets O_NONBLOCK on the file it inherits, and every
        # ansible-core that shares that file then refuses to start ("requires blocking IO").
        stdin = {} if input is not None else {"stdin": subprocess.DEVNULL}
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input, check=False, **stdin)
        if check and r.returncode != 0:
            raise HostError(
                f"ssh {user}@{host} {command!r} exited {r.returncode}: {r.stderr.strip() or r.stdout.strip()}"
            )
        return r

    def controller(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the controller namespace (e.g. ansible-playbook)."""
        if "stdout" not in kw:
            kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        if "input" not in kw:
            kw.setdefault("stdin", subprocess.DEVNULL)  # see run(): ssh beneath must not share ours
        return subprocess.run(["ip", "netns", "exec", self.controller_ns, *argv], check=False, **kw)

    def ansible_env(self) -> dict[str, str]:
        """The environment for ansible run against this run's hosts (ansible.cfg at the repository
        root finds the collection; only the ssh control sockets are per run)."""
        return {**os.environ, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.control_dir), "ANSIBLE_NOCOLOR": "1"}

    def playbook(
        self, playbook: Path | str, *args: str, inventory: Path | None = None, timeout: float = 900, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """``ansible-playbook -i INVENTORY playbook args...`` in the controller namespace, from the
        repository root (its ansible.cfg); INVENTORY defaults to this run's."""
        exe = REPO / ".venv" / "bin" / "ansible-playbook"
        env = {**self.ansible_env(), **kw.pop("env", {})}
        inv = str(inventory or self.inventory)
        return self.controller([str(exe), "-i", inv, str(playbook), *args], env=env, cwd=REPO, timeout=timeout, **kw)

    def scp_to(self, host: str, source: Path, dest: str) -> None:
        """Copy a file or directory tree to ``host`` (scp -r, as root)."""
        r = subprocess.run(
            [str(self.bin / "scp"), "-q", "-r", str(source), f"root@{host}:{dest}"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if r.returncode != 0:
            raise HostError(f"scp {source} to {host}:{dest} failed: {r.stderr.strip()}")

    def authorize(self, host: str, user: str) -> None:
        """Let ``user`` (already created on ``host``) log in with this run's key."""
        pub = (self.dir / "id_ed25519.pub").read_text().strip()
        self.ssh(
            host,
            f"set -e; home=$(getent passwd {user} | cut -d: -f6); install -d -m 700 -o {user} $home/.ssh; "
            f"printf '%s\\n' '{pub}' > $home/.ssh/authorized_keys; chown {user} $home/.ssh/authorized_keys; "
            f"chmod 600 $home/.ssh/authorized_keys",
        )

    def restart(self, host: str, boot_timeout: float = BOOT_TIMEOUT) -> None:
        """Power a host's container off and boot it again (same files, same address)."""
        h = self.host(host)
        h.stop()
        self._save()
        h.boot()
        self._save()
        h.wait_booted(time.monotonic() + boot_timeout)
        self._wait_ssh(time.monotonic() + SSH_TIMEOUT)

    def start_server(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Server:
        """Start a long-running process in the controller namespace (reachable by the hosts at
        198.18.0.1); it is stopped by pid at teardown."""
        log = self.dir / f"{name}.log"
        with log.open("ab") as out:
            p = subprocess.Popen(
                ["ip", "netns", "exec", self.controller_ns, *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        s = Server(name=name, pid=p.pid, started=procs.start_time(p.pid), log=str(log))
        self.state.servers.append(s)
        self._save()
        return s

    # -- down ---------------------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Tear everything of this run down; safe to call twice and after a partial ``up``."""
        done: list[str] = []
        procs.stop([(s.pid, s.started) for s in self.state.servers], 5.0)
        done += [f"server {s.name} (pid {s.pid})" for s in self.state.servers]
        # Every host powers off at once; then SIGKILL whatever did not within the grace period.
        running = [h for h in self.state.hosts if h.running()]
        for h in running:
            procs.send(h.pid or 0, signal.SIGTERM, h.started)
        procs.wait_gone([(h.pid or 0, h.started) for h in running], 10.0)
        for h in self.state.hosts:
            h.stop(grace=5.0)
            done.append(f"host {h.name}")
        for ns in [h.netns for h in self.state.hosts] + [self.controller_ns]:
            netns.kill_pids_in(ns)  # ssh control masters and anything else started there
        for h in self.state.hosts:
            h.remove()
        for ns in [h.netns for h in self.state.hosts] + [self.controller_ns]:
            if netns.exists(ns):
                netns.delete(ns)
                done.append(f"netns {ns}")
        self._keep_logs()
        for m in mounts_under(self.dir) if self.dir.exists() else []:
            subprocess.run(["umount", "-l", m], capture_output=True, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.control_dir, ignore_errors=True)
        untrack(self)
        self.state = State(name=self.name, controller_ns=self.controller_ns)
        return done

    def _keep_logs(self) -> None:
        logs = HOSTS_DIR / "logs" / self.name
        shutil.rmtree(logs, ignore_errors=True)
        for h in self.state.hosts:
            if h.console_log.exists():
                logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(h.console_log, logs / f"{h.name}.console.log")
        for s in self.state.servers:
            if Path(s.log).exists():
                logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(s.log, logs / Path(s.log).name)
