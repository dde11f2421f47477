"""A session is a cgroup: every process started in it ends with it.

``calque session run``/``shell`` ask the daemon to adopt the caller (as Slurm's pam_slurm_adopt
does): the daemon checks that the peer's pid belongs to the uid SO_PEERCRED reported and to the
session's holder, then moves it into the session's cgroup; children follow by inheritance, and
only root can move them out again. At check-in, expiry or release ``cgroup.kill`` ends them all at
once (the kernel's atomic kill, no pid races).

Two placements:

* ``systemd`` (systemd is PID 1): a transient, delegated scope ``calque-<session>.scope`` in
  ``calque.slice``, made through systemd's D-Bus API (``busctl``) at the first adoption, later
  adoptions attached to it (``AttachProcessesToUnit``, which needs ``Delegate=yes``). These calls
  and ``cgroup.kill`` on the scope were checked by hand on a booted test host (systemd 252).
* ``direct``: a cgroup v2 directory ``<cgroup_parent>/<session>``, made at the first adoption (until
  then the session has no process to hold).

Device allow-lists: in systemd mode the scope carries ``DevicePolicy=closed`` and a ``DeviceAllow=``
list (``devices.py``) from which systemd attaches cgroup v2's eBPF device program: inside the
session, no NVIDIA node but the slice's own opens. Direct mode loads no program (calque does not
carry an eBPF loader); there, as everywhere, access also rests on the per-session ACL
(``isolation.py``) and on ending every process that still holds a node open when the session ends
(``holders.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from calque.session.session_config import SessionConfig

log = logging.getLogger("calque.session")

Mode = Literal["systemd", "direct", "off"]
_SID = re.compile(r"^s-[0-9a-f]{1,64}$")
SLICE = "calque.slice"
ADOPT_WAIT_S = 15.0


class CgroupError(Exception):
    """A cgroup could not be made or joined; the message says what to fix."""


def cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``.../unified`` on hybrid hosts)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        pre, _, post = line.partition(" - ")
        if post.split(" ", 1)[0] == "cgroup2":
            return Path(pre.split()[4])
    return None


def systemd_is_init() -> bool:
    # sd_booted()'s test, plus PID 1's name: a container may carry /run/systemd/system from its image.
    try:
        return Path("/run/systemd/system").is_dir() and Path("/proc/1/comm").read_text().strip() == "systemd"
    except OSError:
        return False


def _cgroup_of(pid: int) -> str:
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return ""
    return next((line[3:] for line in lines if line.startswith("0::")), "")


class SessionCgroups:
    def __init__(self, mode: Mode, root: Path | None) -> None:
        self.mode: Mode = mode
        self.root = root  # direct: the parent directory; systemd: <cgroup2>/calque.slice

    @classmethod
    def from_config(cls, cfg: SessionConfig) -> SessionCgroups:
        mount = cgroup2_mount()
        want = cfg.cgroups
        if want == "off":
            return cls("off", None)
        if want == "systemd" or (want == "auto" and systemd_is_init() and shutil.which("busctl")):
            if mount is None:
                raise CgroupError(
                    "cgroups: systemd needs the cgroup v2 hierarchy mounted (systemd.unified_cgroup_hierarchy=1)"
                )
            return cls("systemd", mount / SLICE)
        if cfg.cgroup_parent is None and mount is None:
            if want == "direct":
                raise CgroupError(
                    "cgroups: direct needs cgroup v2 mounted (or set cgroup_parent); use cgroups: off to run without"
                )
            log.warning(
                "no cgroup v2 hierarchy on this host: sessions are not cgroups (only the --shell mode's guarantees)"
            )
            return cls("off", None)
        parent = cfg.cgroup_parent or (mount / "calque")  # type: ignore[operator]
        return cls("direct", parent)

    def dir(self, sid: str) -> Path | None:
        if self.root is None or not _SID.match(sid):
            return None
        return self.root / (f"calque-{sid}.scope" if self.mode == "systemd" else sid)

    def create(self, sid: str) -> None:
        """Direct mode: the session's cgroup, empty (a systemd scope needs a process: made at adoption)."""
        d = self.dir(sid)
        if self.mode != "direct" or d is None:
            return
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CgroupError(f"cannot make the session's cgroup {d}: {exc.strerror or exc}") from exc

    def adopt(self, sid: str, pid: int, scope_properties: Sequence[tuple[str, ...]] = ()) -> Path:
        """Move ``pid`` into the session's cgroup; returns the cgroup directory. ``scope_properties``
        (each a property in busctl's ``a(sv)`` argument form) go on a systemd scope made now."""
        d = self.dir(sid)
        if d is None:
            raise CgroupError("sessions are not cgroups on this host (cgroups: off, or no cgroup v2)")
        if self.mode == "systemd":
            self._adopt_systemd(sid, d, pid, list(scope_properties))
            return d
        self.create(sid)
        try:
            (d / "cgroup.procs").write_text(f"{pid}\n")
        except OSError as exc:
            raise CgroupError(f"cannot move pid {pid} into {d}: {exc.strerror or exc}") from exc
        return d

    def _adopt_systemd(self, sid: str, d: Path, pid: int, extra: list[tuple[str, ...]]) -> None:
        unit = f"calque-{sid}.scope"
        base = [
            "busctl",
            "call",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
        ]
        attach = [*base, "AttachProcessesToUnit", "ssau", unit, "", "1", str(pid)]
        # Delegate: AttachProcessesToUnit (later adoptions) is refused on non-delegated units.
        props: list[tuple[str, ...]] = [
            ("PIDs", "au", "1", str(pid)),
            ("Slice", "s", SLICE),
            ("Delegate", "b", "true"),
            ("Description", "s", f"calque session {sid}"),
        ]
        props += extra
        flat = [x for prop in props for x in prop]
        start = [*base, "StartTransientUnit", "ssa(sv)a(sa(sv))", unit, "fail", str(len(props)), *flat, "0"]
        # Two adoptions into one session at once (two `session run` as its first work, in two worker
        # processes): both may see no scope and ask to start it; systemd starts one and refuses the
        # other ("already loaded or has a fragment file"), which then attaches to the scope the first
        # made, once it is there. Likewise a scope that emptied and went away is started again.
        deadline = time.monotonic() + ADOPT_WAIT_S
        while True:
            starting = not d.is_dir()
            res = subprocess.run(start if starting else attach, capture_output=True, text=True, timeout=10)
            if res.returncode == 0:
                break
            err = res.stderr.strip()
            raced = (
                any(w in err for w in ("already loaded", "already exists", "fragment file"))
                if starting
                else any(w in err for w in ("not loaded", "not active", "not found", "No such"))
            )
            if not raced or time.monotonic() >= deadline:
                raise CgroupError(f"systemd refused {unit} for pid {pid}: {err}")
            time.sleep(0.01)
        # systemd answers when the job is queued; reply only once the pid is in the scope, so that
        # nothing the command forks after exec starts outside it.
        # Usually milliseconds; a loaded host's systemd can take seconds to run the job.
        while f"/{SLICE}/{unit}" not in _cgroup_of(pid):
            if time.monotonic() >= deadline:
                raise CgroupError(f"pid {pid} did not reach {unit} within {ADOPT_WAIT_S:.0f} s")
            time.sleep(0.005)

    def sessions(self) -> list[str]:
        """Session ids that have a cgroup now."""
        if self.root is None:
            return []
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        if self.mode == "systemd":
            names = [
                n[len("calque-") : -len(".scope")] for n in names if n.startswith("calque-s-") and n.endswith(".scope")
            ]
        return [n for n in names if _SID.match(n)]

    def pids(self, sid: str) -> list[int]:
        d = self.dir(sid)
        if d is None:
            return []
        try:
            return [int(x) for x in (d / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def signal(self, sid: str, sig: int) -> None:
        for pid in self.pids(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def kill(self, sid: str, wait: float = 1.0) -> list[int]:
        """End every process in the session's cgroup and remove it; returns the pids that were there."""
        d = self.dir(sid)
        if d is None or not d.is_dir():
            return []
        pids = self.pids(sid)
        try:
            (d / "cgroup.kill").write_text("1\n")
        except OSError:  # a kernel before 5.14: one SIGKILL per pid, repeated until empty
            self.signal(sid, signal.SIGKILL)
        deadline = time.monotonic() + wait
        while True:
            left = self.pids(sid)
            if not left:
                break
            if time.monotonic() >= deadline:
                log.error("session %s: pids %s still in %s after SIGKILL", sid, left, d)
                return pids
            self.signal(sid, signal.SIGKILL)
            time.sleep(0.01)
        if self.mode == "systemd":
            self._stop_scope(sid)
            return pids
        try:
            d.rmdir()
        except OSError as exc:
            log.error("cannot remove %s: %s", d, exc)
        return pids

    def _stop_scope(self, sid: str) -> None:
        """Ask systemd to stop the emptied scope now.

        systemd ends an empty scope on its own when the kernel tells it the cgroup emptied, but on a
        hybrid hierarchy in a container that notice can be lost, and the unit then stays active with no
        process for ever (seen on the booted test hosts: 300 s and counting). StopUnit makes the end
        not depend on it; a scope already gone answers "not loaded", which is what was wanted.
        """
        unit = f"calque-{sid}.scope"
        cmd = ["busctl", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1"]
        cmd += ["org.freedesktop.systemd1.Manager", "StopUnit", "ss", unit, "replace"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("session %s: could not ask systemd to stop %s: %s", sid, unit, exc)
            return
        if res.returncode != 0 and "not loaded" not in res.stderr:
            log.warning("session %s: systemd did not stop %s: %s", sid, unit, res.stderr.strip())
