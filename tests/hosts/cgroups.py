"""Each test host in a cgroup of its own.

``systemd-nspawn --keep-unit --register=no`` makes its ``supervisor`` and ``payload`` cgroups under
the cgroup it was started in. Started from one process, every host got the same ones: the hosts'
systemd instances all managed one ``payload`` tree, so a scope one host made (``calque.slice/...``)
was another host's to clean up (a session's scope died within milliseconds of starting, in a
three-host fleet only). Before nspawn starts, the harness now moves it into
``<hierarchy>/calque-test-hosts/<machine>`` in the hierarchies nspawn uses (cgroup v2, and v1's
``name=systemd`` on hybrid hosts), and removes those directories once the host is gone.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PARENT = "calque-test-hosts"


def _hierarchies() -> list[Path]:
    """Mount points of cgroup v2 and of v1's ``name=systemd`` (what nspawn creates its cgroups in)."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            pre, _, post = line.rstrip("\n").partition(" - ")
            fstype, _, opts = post.split(" ", 2)
            if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in opts.split(" ")[-1].split(",")):
                found.append(Path(pre.split()[4]))
    return found


def dirs(machine: str) -> list[Path]:
    return [h / PARENT / machine for h in _hierarchies()]


def prepare(machine: str) -> list[Path]:
    """Make the host's cgroup directories (empty); returns them."""
    made = dirs(machine)
    for d in made:
        d.mkdir(parents=True, exist_ok=True)
    return made


def wrap(made: list[Path], argv: list[str]) -> list[str]:
    """``argv`` run by a shell that first moves itself into ``made``, then execs it (same pid)."""
    moves = "".join(f'echo $$ > "{d}/cgroup.procs" && ' for d in made)
    return ["/bin/sh", "-c", f'{moves}exec "$@"', "sh", *argv]


def cpu_seconds(machine: str) -> float | None:
    """CPU time the host has used so far (cgroup v2's cpu.stat: everything in the container), if readable."""
    for d in dirs(machine):
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in (d / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
    return None


def remove(machine: str) -> None:
    """Remove the host's cgroup directories, deepest first (only empty ones can go; nspawn leaves its
    ``supervisor`` and ``payload`` behind)."""
    for top in dirs(machine):
        if not top.is_dir():
            continue
        for root, subdirs, _ in sorted(os.walk(top), key=lambda w: -len(Path(w[0]).parts)):
            del subdirs
            with contextlib.suppress(OSError):
                Path(root).rmdir()


def leftovers(prefix: str) -> list[str]:
    """Machines whose cgroup directories are still there, of those named with ``prefix``."""
    names: set[str] = set()
    for h in _hierarchies():
        with contextlib.suppress(OSError):
            names |= {n for n in os.listdir(h / PARENT) if n.startswith(prefix)}
    return sorted(names)
