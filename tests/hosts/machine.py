"""One booted test host: a copy-on-write copy of the image, booted by systemd-nspawn with systemd as
PID 1 inside the host's network namespace, tracked by the nspawn process's pid.

The copy is an overlay mount (the image is the read-only lower layer, the host's changes go to its
own upper directory), so laying out a host costs no copying; where overlayfs is unavailable the
image is copied instead. The upper directory lives on a tmpfs of its own: a host writes a venv of
thousands of files, and on a shared disk writing them and deleting them at teardown cost tens of
seconds per host (about 1 ms per unlink measured here); unmounting a tmpfs frees them at once.
``CALQUE_HOSTS_TMPFS=0`` keeps them on disk (a machine short of memory).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import cgroups, procs
from .paths import HANG_S

try:  # under pytest (tests/ on sys.path) ...
    from support.timings import record
except ImportError:  # ... or `python -m tests.hosts` from the repository root
    from tests.support.timings import record

BOOT_TIMEOUT = HANG_S  # systemd reaching running/degraded: however loaded the machine, only a hang fails
STOP_GRACE = 20.0  # a clean poweroff of the container before SIGKILL
# A cap, not a reservation: a converged host's changes are a few hundred MB (the venv, the stand-in debs).
LAYER_SIZE = "4g"


class HostError(RuntimeError):
    """A host did not boot or did not answer; the message says where its console log is."""


@dataclass
class Host:
    """What a run records about one host (state.json), enough for another process to tear it down."""

    name: str
    shape: str
    groups: list[str]
    address: str
    netns: str
    machine: str  # nspawn's machine name: unique across runs
    dir: str  # upper/, work/, rootfs/ (the mount point), console.log
    overlay: bool = False
    tmpfs: bool = False  # upper/ and work/ are on a tmpfs mounted at layer/
    pid: int | None = None  # systemd-nspawn
    started: int | None = None  # its start time, so a reused pid is never signalled

    @property
    def rootfs(self) -> Path:
        return Path(self.dir) / "rootfs"

    @property
    def console_log(self) -> Path:
        return Path(self.dir) / "console.log"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # -- layout -------------------------------------------------------------------------------------

    @property
    def layer(self) -> Path:
        return Path(self.dir) / "layer"

    def lay_out(self, image: Path, authorized_key: str, etc_hosts: str, layers: tuple[Path, ...] = ()) -> None:
        """The host's root: ``layers`` (uppermost first, e.g. the runtime's dependencies) over ``image``."""
        d = Path(self.dir)
        for sub in ("layer", "rootfs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        if os.environ.get("CALQUE_HOSTS_TMPFS", "1") != "0":
            tmpfs = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={LAYER_SIZE},mode=0755", "tmpfs", str(self.layer)],
                capture_output=True,
            )
            self.tmpfs = tmpfs.returncode == 0  # else the layer stays a directory on disk
        for sub in ("upper", "work"):
            (self.layer / sub).mkdir(exist_ok=True)
        lower = ":".join(str(p) for p in (*layers, image))
        opts = f"lowerdir={lower},upperdir={self.layer / 'upper'},workdir={self.layer / 'work'}"
        mount = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", opts, str(self.rootfs)], capture_output=True, text=True
        )
        if mount.returncode == 0:
            self.overlay = True
        else:  # no overlayfs here: a full copy (reflinked where the filesystem can)
            shutil.rmtree(self.rootfs)
            subprocess.run(["cp", "-a", "--reflink=auto", str(image), str(self.rootfs)], check=True)
            for layer in reversed(layers):  # the lowest first, so an upper one's files win
                subprocess.run(["cp", "-a", "--reflink=auto", f"{layer}/.", str(self.rootfs)], check=True)
        root = self.rootfs
        (root / "etc/hostname").write_text(f"{self.name}\n")
        (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
        (root / "etc/hosts").write_text(etc_hosts)
        ssh = root / "root/.ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        (ssh / "authorized_keys").write_text(authorized_key + "\n")
        (ssh / "authorized_keys").chmod(0o600)

    # -- boot and stop ------------------------------------------------------------------------------

    def boot(self) -> None:
        """Start systemd-nspawn detached (its own session), so a CLI `up` can exit and leave it running."""
        cmd = [
            "systemd-nspawn",
            "--boot",
            "--register=no",
            "--keep-unit",
            f"--network-namespace-path=/run/netns/{self.netns}",
            f"--directory={self.rootfs}",
            f"--machine={self.machine}",
            f"--hostname={self.name}",
            "--console=read-only",
            "--resolv-conf=off",
            "--timezone=off",
            "--link-journal=no",
        ]
        # In a cgroup of its own: hosts started from one process must not share nspawn's cgroups.
        cmd = cgroups.wrap(cgroups.prepare(self.machine), cmd)
        with self.console_log.open("ab") as log:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pid = proc.pid
        self.started = procs.start_time(proc.pid)

    def leader(self) -> int:
        """The pid of the host's PID 1 (systemd), the child of systemd-nspawn."""
        if self.pid is None or not procs.alive(self.pid, self.started):
            raise HostError(f"host {self.name}: systemd-nspawn is not running; see {self.console_log}")
        kids = procs.children(self.pid)
        if not kids:
            raise HostError(f"host {self.name}: the container has not started yet")
        return kids[0]

    def exec(self, argv: list[str], timeout: float = 60.0, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the host (all its namespaces) as root, without ssh."""
        cmd = ["nsenter", "-t", str(self.leader()), "-a", *argv]
        return subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=check
        )

    def wait_booted(self, deadline: float) -> str:
        """Wait until systemd says running or degraded; returns that state."""
        state = "not started"
        while time.monotonic() < deadline:
            if self.pid is not None and not procs.alive(self.pid, self.started):
                procs.reap(self.pid)
                raise HostError(f"host {self.name}: systemd-nspawn exited during boot; see {self.console_log}")
            try:
                left = max(1.0, deadline - time.monotonic())
                r = self.exec(["systemctl", "is-system-running", "--wait"], timeout=min(left, 30.0))
                state = r.stdout.strip() or r.stderr.strip()
                if state in ("running", "degraded"):
                    return state
            except (HostError, subprocess.TimeoutExpired):
                pass
            time.sleep(0.3)
        raise HostError(
            f"host {self.name}: systemd did not finish booting (last state {state!r}); see {self.console_log}"
        )

    def running(self) -> bool:
        return self.pid is not None and procs.alive(self.pid, self.started)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Power the container off (nspawn turns SIGTERM into a clean shutdown), SIGKILL after ``grace``."""
        if self.pid is not None:
            used = cgroups.cpu_seconds(self.machine)
            if used is not None:  # for the suite's time report: what the booted tier costs in CPU
                record("host-cpu", self.machine, time.time(), used)
            procs.stop([(self.pid, self.started)], grace, signal.SIGTERM)
            procs.reap(self.pid)
        self.pid = None
        self.started = None
        cgroups.remove(self.machine)

    def remove(self) -> None:
        """Unmount and delete the host's files (the image is untouched)."""
        d = Path(self.dir)
        if self.overlay or _is_mount(self.rootfs):
            r = subprocess.run(["umount", str(self.rootfs)], capture_output=True, check=False)
            if r.returncode != 0 and _is_mount(self.rootfs):
                subprocess.run(["umount", "-l", str(self.rootfs)], capture_output=True, check=False)
        if self.tmpfs or _is_mount(self.layer):
            r = subprocess.run(["umount", str(self.layer)], capture_output=True, check=False)
            if r.returncode != 0 and _is_mount(self.layer):
                subprocess.run(["umount", "-l", str(self.layer)], capture_output=True, check=False)
        for sub in ("rootfs", "layer"):
            shutil.rmtree(d / sub, ignore_errors=True)


def _is_mount(path: Path) -> bool:
    target = str(path.resolve()) if path.exists() else str(path)
    with open("/proc/self/mountinfo") as fh:
        return any(line.split()[4] == target for line in fh)


def mounts_under(directory: Path) -> list[str]:
    prefix = str(directory.resolve()) + "/"
    with open("/proc/self/mountinfo") as fh:
        return [line.split()[4] for line in fh if line.split()[4].startswith(prefix)]
