"""What a checkout gives: the environment, and (MIG) the capability device nodes for the holder only.

A MIG device is reachable only through its GPU-instance and compute-instance capability nodes
(``/dev/nvidia-caps/nvidia-capN``); their minors come from
``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/[ci<C>/]access``. The daemon hands both
nodes to the holder (owner = holder, mode 0400) and takes them back (root, 0400) at the end. The
driver must not reset modes behind us: that needs ``DeviceFileModify: 0``
(``options nvidia NVreg_ModifyDeviceFiles=0``); when it reads 1 the daemon says so and re-asserts
the modes on every timer tick.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from calque.models.session import Slice

HOLDER_MODE = 0o400
FREE_MODE = 0o400


@dataclass(frozen=True)
class CapNode:
    access_file: Path
    device: Path
    minor: int
    modify: bool


def _read_access(path: Path) -> tuple[int, bool]:
    minor, modify = -1, False
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor":
            minor = int(value.strip())
        elif key.strip() == "DeviceFileModify":
            modify = value.strip() == "1"
    if minor < 0:
        raise ValueError(f"{path} has no DeviceFileMinor")
    return minor, modify


_NODES: dict[tuple[str, str, int | None, int | None, int | None], list[CapNode]] = {}


def cap_nodes(host_root: Path, sl: Slice) -> list[CapNode]:
    """The GI and CI capability nodes of a MIG slice (empty for MPS); raises OSError if missing.

    Cached per (root, MIG UUID, minor, GI, CI): a MIG device keeps its capability minors for its
    whole life, and a re-created one has a new UUID.
    """
    if sl.kind != "mig" or sl.gpu_minor is None or sl.gi_id is None:
        return []
    key = (str(host_root), sl.id, sl.gpu_minor, sl.gi_id, sl.ci_id)
    hit = _NODES.get(key)
    if hit is not None and all(n.access_file.exists() for n in hit):
        return hit
    nodes = _read_nodes(host_root, sl)
    _NODES[key] = nodes
    return nodes


def _read_nodes(host_root: Path, sl: Slice) -> list[CapNode]:
    assert sl.gpu_minor is not None and sl.gi_id is not None
    base = host_root / "proc/driver/nvidia/capabilities" / f"gpu{sl.gpu_minor}" / "mig" / f"gi{sl.gi_id}"
    files = [base / "access"]
    if sl.ci_id is not None:
        files.append(base / f"ci{sl.ci_id}" / "access")
    out = []
    for f in files:
        minor, modify = _read_access(f)
        out.append(CapNode(f, host_root / "dev/nvidia-caps" / f"nvidia-cap{minor}", minor, modify))
    return out


def _set(node: CapNode, uid: int, gid: int, mode: int) -> bool:
    """chown/chmod when they differ; True when something changed."""
    st = node.device.stat()
    changed = False
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(node.device, uid, gid)
        changed = True
    if st.st_mode & 0o7777 != mode:
        os.chmod(node.device, mode)
        changed = True
    return changed


def grant(host_root: Path, sl: Slice, uid: int) -> list[str]:
    """Give the slice's nodes to ``uid`` alone; returns warnings for the holder."""
    warnings = []
    for node in cap_nodes(host_root, sl):
        _set(node, uid, 0, HOLDER_MODE)
        if node.modify:
            warnings.append(
                f"{node.access_file} says DeviceFileModify: 1, so the driver may reset {node.device}; "
                "set 'options nvidia NVreg_ModifyDeviceFiles=0'"
            )
    return warnings


def revoke(host_root: Path, sl: Slice) -> None:
    for node in cap_nodes(host_root, sl):
        _set(node, 0, 0, FREE_MODE)


def environment(sl: Slice, session_id: str, expires: datetime) -> dict[str, str]:
    """What the holder exports to reach this slice and no other."""
    env = {"CALQUE_SESSION_ID": session_id, "CALQUE_SESSION_EXPIRES": expires.isoformat()}
    if sl.kind == "mig":
        assert sl.mig_uuid is not None
        env["CUDA_VISIBLE_DEVICES"] = sl.mig_uuid
    else:
        assert sl.pipe_directory is not None
        env["CUDA_VISIBLE_DEVICES"] = sl.gpu_uuid
        env["CUDA_MPS_PIPE_DIRECTORY"] = sl.pipe_directory
        if sl.log_directory:
            env["CUDA_MPS_LOG_DIRECTORY"] = sl.log_directory
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(sl.active_thread_percentage)
        # Device ordinal 0 is the one GPU CUDA_VISIBLE_DEVICES leaves visible.
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={sl.pinned_mem_limit_mib}M"
    return env


def shell_exports(env: dict[str, str]) -> str:
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))
