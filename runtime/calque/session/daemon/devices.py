"""The device allow-list of a session's systemd scope: every device but NVIDIA's, then the slice's own.

cgroup v2 device control is an eBPF program on the cgroup; systemd builds and attaches it from a
unit's ``DeviceAllow=`` list under ``DevicePolicy=closed`` (what is not listed is refused on open,
whatever the node's mode or ACL). Like Slurm's ``ConstrainDevices``, the list only takes NVIDIA's
nodes away: every other character device stays allowed (terminals, FUSE, ...), named by fnmatch
patterns over ``/proc/devices`` so that a driver loaded later is covered too. Then, back in:

* MIG: ``/dev/nvidiactl``, the slice's GPU ``/dev/nvidia<minor>``, UVM, and the slice's own GI and
  CI capability nodes; no other GPU and no other slice's capability node opens inside the scope.
* MPS: every GPU node and UVM (clients reach the MPS server, which holds the GPU), no MIG
  capability node.

Paths are listed only where they are character devices (the simulator's nodes are plain files, so
on a simulated host the list ends up allowing every non-NVIDIA group and nothing else).
"""

from __future__ import annotations

import stat
from pathlib import Path

from calque.models.session import Slice
from calque.session.daemon.isolation import cap_nodes

# Every NVIDIA driver's /proc/devices name starts with this (nvidia-frontend, nvidia-uvm,
# nvidia-caps, nvidia-nvswitch, nvidia-nvlink, nvidia-caps-imex-channels).
NVIDIA = "nvidia"
RWM = "rwm"


def groups_not_starting_with(prefix: str) -> list[str]:
    """fnmatch patterns that together match every name except those starting with ``prefix``:
    ``[!n]*``, ``n``, ``n[!v]*``, ``nv``, ... (a name that stops short of the prefix, or leaves it)."""
    out = []
    for i, ch in enumerate(prefix):
        if i:
            out.append(prefix[:i])
        out.append(f"{prefix[:i]}[!{ch}]*")
    return out


def _char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


def allow_list(host_root: Path, sl: Slice) -> list[tuple[str, str]]:
    """``DeviceAllow=`` entries (specifier, access) for a session on ``sl``."""
    entries = [("block-*", RWM)]
    entries += [(f"char-{p}", RWM) for p in groups_not_starting_with(NVIDIA)]
    entries.append(("char-nvidia-uvm", RWM))  # /dev/nvidia-uvm and -uvm-tools: CUDA needs them on any slice
    dev = host_root / "dev"
    if sl.kind == "mps":
        # /dev/nvidiactl and every /dev/nvidiaN: major 195, named nvidia-frontend or nvidia by driver branch
        entries += [("char-nvidia-frontend", RWM), ("char-nvidia", RWM)]
        return entries
    nodes = [dev / "nvidiactl"]
    if sl.gpu_minor is not None:
        nodes.append(dev / f"nvidia{sl.gpu_minor}")
    nodes += [n.device for n in cap_nodes(host_root, sl)]
    entries += [(str(n), RWM) for n in nodes if _char_device(n)]
    return entries


def scope_properties(host_root: Path, sl: Slice) -> list[tuple[str, ...]]:
    """``DevicePolicy`` and ``DeviceAllow``, each in busctl's ``a(sv)`` argument form."""
    allow = allow_list(host_root, sl)
    return [
        ("DevicePolicy", "s", "closed"),
        ("DeviceAllow", "a(ss)", str(len(allow)), *(x for entry in allow for x in entry)),
    ]
