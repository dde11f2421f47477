"""Whether this machine can boot test hosts, and if not, the one reason that says what to install."""

from __future__ import annotations

import os
import shutil

# Debian/Ubuntu package that provides each command (scripts/test installs them).
TOOLS = {
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "ip": "iproute2",
    "nsenter": "util-linux",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
}


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "booting hosts needs root (network namespaces, mounts, systemd-nspawn)"
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        return f"missing commands; install them with: apt-get install {' '.join(missing)}"
    return None
