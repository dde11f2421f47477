"""Teardown beyond one run's ``down()``: every run of this checkout and what a crashed run left
(``down --all``), and the hooks that end this process's runs at exit or on SIGTERM/SIGHUP."""

from __future__ import annotations

import atexit
import hashlib
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from . import cgroups, netns, procs
from .machine import mounts_under
from .paths import NETNS_PREFIX, RUNS_DIR

if TYPE_CHECKING:
    from .fleet import Fleet

CONTROL_ROOT = Path("/run/cth")  # ssh control sockets: ssh's listener path must stay under 108 bytes


def control_dir_of(name: str) -> Path:
    """Run ``name``'s ssh control socket folder: /run/cth/<10 hex> (checkout and run hashed)."""
    return CONTROL_ROOT / hashlib.sha256(f"{NETNS_PREFIX}{name}".encode()).hexdigest()[:10]


def down_all() -> list[str]:
    """Tear down every run under build/hosts/runs and anything a crashed run left: namespaces with
    the harness's prefix, systemd-nspawn processes booting a root under build/hosts/runs, mounts."""
    from .fleet import NAME_RE, Fleet

    done: list[str] = []
    if RUNS_DIR.is_dir():
        for d in sorted(RUNS_DIR.iterdir()):
            if (d / "state.json").exists() and NAME_RE.match(d.name):
                done += Fleet(d.name).down()
    runs = str(RUNS_DIR) + "/"
    strays = [p for p in procs.all_pids() if _is_our_nspawn(procs.cmdline(p), runs)]
    procs.stop([(p, procs.start_time(p)) for p in strays], 20.0)
    done += [f"systemd-nspawn pid {p}" for p in strays]
    for ns in netns.list_namespaces(NETNS_PREFIX):
        netns.kill_pids_in(ns)
        netns.delete(ns)
        done.append(f"netns {ns}")
    if RUNS_DIR.is_dir():
        for m in sorted(mounts_under(RUNS_DIR), key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True, check=False)
            done.append(f"mount {m}")
        for d in RUNS_DIR.iterdir():
            shutil.rmtree(control_dir_of(d.name), ignore_errors=True)
            shutil.rmtree(d, ignore_errors=True)
    for machine in cgroups.leftovers(NETNS_PREFIX):  # this checkout's hosts' cgroups (machine names share the prefix)
        cgroups.remove(machine)
        done.append(f"cgroup {machine}")
    return done


def _is_our_nspawn(argv: list[str], runs: str) -> bool:
    return (
        bool(argv) and Path(argv[0]).name == "systemd-nspawn" and any(a.startswith(f"--directory={runs}") for a in argv)
    )


# -- teardown on exit: fleets this process brought up are torn down at exit or on SIGTERM/SIGHUP ------

_LIVE: dict[str, Fleet] = {}
_LOCK = threading.Lock()
_HOOKED = False


def track(f: Fleet) -> None:
    global _HOOKED
    with _LOCK:
        _LIVE[f.name] = f
        if not _HOOKED:
            atexit.register(_down_live)
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGHUP):
                    if signal.getsignal(sig) in (signal.SIG_DFL, None):
                        signal.signal(sig, _exit_on_signal)
            _HOOKED = True


def untrack(f: Fleet) -> None:
    with _LOCK:
        if _LIVE.get(f.name) is f:
            del _LIVE[f.name]


def detach(f: Fleet) -> None:
    """Leave ``f`` running when this process exits (the CLI's ``up``: ``down`` ends it later)."""
    untrack(f)


def _down_live() -> None:
    for f in list(_LIVE.values()):
        try:
            f.down()
        except Exception as e:  # teardown of the others must still run
            print(f"tests.hosts: teardown of run {f.name} failed: {e}")


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)
