"""The Debian bookworm root filesystem every test host boots: debootstrap once, cached, shared.

The image is keyed by what goes into it (suite, variant, package list, the tweaks below), built into a
temporary directory and renamed into place only when complete, under a file lock, so concurrent runs
share one build and a killed build never leaves a half image that looks ready.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from .paths import IMAGES_DIR, locked

SUITE = "bookworm"
VARIANT = "minbase"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Hosts reach no package index (like hosts in private subnets), so everything the roles use on a host
# must be here: systemd as PID 1 (systemd, systemd-sysv, dbus), sshd for ansible, python3 and venv for
# the calque virtualenv, python3-apt/python3-debian for ansible's apt and deb822_repository modules
# (the nvidia_driver role's local repository), sudo and acl for become_user to unprivileged users
# (ansible sets ACLs on its temporary files), iproute2 and procps for checks, kmod for the driver role,
# logrotate (on every standard Debian install) for the session service's rotation of its audit trail,
# dbus-user-session so that a user's own systemd manager has a bus (the e2e's user tries to leave
# a session through it, as on any desktop or lingering login), munge for identity across hosts (the
# session front door: every request that crosses a host carries a munge credential).
PACKAGES: tuple[str, ...] = (
    "acl",
    "dbus",
    "dbus-user-session",
    "iproute2",
    "kmod",
    "logrotate",
    "munge",
    "openssh-server",
    "procps",
    "python3",
    "python3-apt",
    "python3-debian",
    "python3-venv",
    "sudo",
    "systemd",
    "systemd-sysv",
)
# Timers that would run apt (and take dpkg's lock) in the middle of a test, masked in the image.
# logrotate.timer too: the e2e rotates by hand, when it wants to. systemd-remount-fs.service: a host's
# root is the overlay the harness mounted, there is nothing to remount, and a remount that failed
# once (1 boot in about 10) left that host "degraded".
MASKED_UNITS = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "logrotate.timer",
    "systemd-remount-fs.service",
)
# Bumped whenever _customise changes, so the key changes with it.
IMAGE_REVISION = 1


class ImageError(RuntimeError):
    """The image could not be built (debootstrap failed, no network to the mirror, ...)."""


def image_key(packages: tuple[str, ...] = PACKAGES) -> str:
    doc = {"suite": SUITE, "variant": VARIANT, "packages": sorted(packages), "masked": MASKED_UNITS}
    doc["revision"] = IMAGE_REVISION
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def image_dir(packages: tuple[str, ...] = PACKAGES) -> Path:
    return IMAGES_DIR / f"{SUITE}-{image_key(packages)}"


def ensure_image(packages: tuple[str, ...] = PACKAGES, *, log: Path | None = None) -> Path:
    """The root filesystem directory for ``packages``, built with debootstrap the first time."""
    final = image_dir(packages)
    rootfs = final / "rootfs"
    if (final / "ready").exists():
        return rootfs
    with locked(final.parent / f"{final.name}.lock"):
        if (final / "ready").exists():  # another run built it while we waited
            return rootfs
        _build(final, packages, log or final.parent / f"{final.name}.log")
    return rootfs


def _build(final: Path, packages: tuple[str, ...], log: Path) -> None:
    tmp = final.parent / f"{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)
    tmp.mkdir(parents=True)
    debs = IMAGES_DIR / "debs"  # downloaded .debs kept across image keys (debootstrap --cache-dir)
    debs.mkdir(parents=True, exist_ok=True)
    mirror = os.environ.get("CALQUE_HOSTS_MIRROR", DEFAULT_MIRROR)
    cmd = [
        "debootstrap",
        f"--variant={VARIANT}",
        f"--include={','.join(sorted(packages))}",
        f"--cache-dir={debs.resolve()}",
        SUITE,
        str(tmp / "rootfs"),
        mirror,
    ]
    t0 = time.monotonic()
    with log.open("w") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False, timeout=1200)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        shutil.rmtree(tmp, ignore_errors=True)
        raise ImageError(
            f"debootstrap {SUITE} failed (exit {proc.returncode}); it needs network access to {mirror} "
            f"(set CALQUE_HOSTS_MIRROR for another mirror). Last lines of {log}:\n" + "\n".join(tail)
        )
    _customise(tmp / "rootfs")
    (tmp / "build.json").write_text(
        json.dumps({"packages": sorted(packages), "seconds": round(time.monotonic() - t0, 1), "mirror": mirror})
    )
    (tmp / "ready").write_text("")
    tmp.rename(final)


def _customise(root: Path) -> None:
    """What every host shares: no apt timers, an empty machine id, no inherited hostname, no caches."""
    for unit in MASKED_UNITS:
        link = root / "etc/systemd/system" / unit
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("/dev/null")
    # Each host gets its own machine id and hostname when it is laid out (machine.py).
    (root / "etc/machine-id").write_text("")
    (root / "etc/hostname").write_text("localhost\n")
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    # No index is reachable from a host: no sources either, so `apt-get update` there reads only the
    # repositories a test adds (the nvidia_driver role's local one) instead of failing on the mirror.
    (root / "etc/apt/sources.list").write_text("")
    for stale in (root / "var/lib/apt/lists").glob("*"):
        if stale.is_file() and stale.name != "lock":
            stale.unlink()


def host_public_key(rootfs: Path) -> str:
    """The image's ssh host key (every host of one image shares it; known_hosts pins it)."""
    kind, key = (rootfs / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
    return f"{kind} {key}"
