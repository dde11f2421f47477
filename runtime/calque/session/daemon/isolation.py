"""What a checkout gives: the environment, and access to the slice for the holder only.

A MIG device is reachable only through its GPU-instance and compute-instance capability nodes
(``/dev/nvidia-caps/nvidia-capN``); their minors come from
``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/[ci<C>/]access``. The nodes stay root's
(``root:root 0400``); the holder reads them through a per-session POSIX ACL entry
(``user:<holder>:r--``), which only the owner (root) can change: the holder cannot chmod the node
wider. At the end the ACL goes and the node is root's alone again. An MPS slot's pipe directory is
closed the same way: ``root 0700`` plus one ACL entry per uid holding a slot on that MPS daemon.
The driver must not reset modes behind us: that needs ``DeviceFileModify: 0``
(``options nvidia NVreg_ModifyDeviceFiles=0``); when it reads 1 the daemon says so and re-asserts
the nodes on every re-check; ``watch.py`` closes a node the moment it appears or changes.
"""

from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from calque.models.session import Slice

FREE_MODE = 0o400
PIPE_MODE = 0o700
_ACL_XATTR = "system.posix_acl_access"
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_NO_ID = 0xFFFFFFFF


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


def acl_bytes(owner_perm: int, users: dict[int, int]) -> bytes:
    """A POSIX access ACL as the kernel stores it: owner, one entry per uid, no group or other access."""
    return _acl_bytes(owner_perm, tuple(sorted(users.items())))


@functools.lru_cache(maxsize=1024)  # one per holder and permission: built once, set at every checkout
def _acl_bytes(owner_perm: int, users: tuple[tuple[int, int], ...]) -> bytes:
    entries = [(_USER_OBJ, owner_perm, _NO_ID)]
    entries += [(_USER, perm, uid) for uid, perm in users]
    mask = max((perm for _, perm in users), default=0)
    entries += [(_GROUP_OBJ, 0, _NO_ID), (_MASK, mask, _NO_ID), (_OTHER, 0, _NO_ID)]
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", t, p, i) for t, p, i in entries)


@functools.lru_cache(maxsize=8)
def _mode_only_acl(owner_perm: int) -> bytes:
    entries = [(_USER_OBJ, owner_perm, _NO_ID), (_GROUP_OBJ, 0, _NO_ID), (_OTHER, 0, _NO_ID)]
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", t, p, i) for t, p, i in entries)


def acl_users(path: Path) -> dict[int, int]:
    """uid -> permission bits of the named-user entries of ``path``'s ACL (empty without one)."""
    try:
        raw = os.getxattr(path, _ACL_XATTR, follow_symlinks=False)
    except OSError:
        return {}
    out = {}
    for off in range(4, len(raw) - 7, 8):
        tag, perm, uid = struct.unpack_from("<HHI", raw, off)
        if tag == _USER:
            out[uid] = perm
    return out


def _restrict(path: Path, owner_perm: int, users: dict[int, int]) -> bool:
    """Make ``path`` root's with exactly ``users`` in its ACL; True when something changed."""
    st = os.lstat(path)
    changed = False
    if (st.st_uid, st.st_gid) != (0, 0):
        os.chown(path, 0, 0, follow_symlinks=False)
        changed = True
    want_mode = (owner_perm << 6) | (max(users.values(), default=0) << 3)
    same_mode = st.st_mode & 0o7777 == want_mode
    if users:
        want = acl_bytes(owner_perm, users)
        if same_mode:  # only then can the ACL already be right (at a checkout the mode differs)
            try:
                if os.getxattr(path, _ACL_XATTR, follow_symlinks=False) == want:
                    return changed
            except OSError:
                pass
        os.setxattr(path, _ACL_XATTR, want, follow_symlinks=False)  # sets the mode bits too
        return True
    if not same_mode:
        # One call: an ACL of owner, group and other alone is the mode itself, so the kernel drops
        # the stored ACL and sets the mode (a filesystem without ACLs gets a chmod).
        try:
            os.setxattr(path, _ACL_XATTR, _mode_only_acl(owner_perm), follow_symlinks=False)
        except OSError:
            os.chmod(path, want_mode)
        return True
    try:
        os.getxattr(path, _ACL_XATTR, follow_symlinks=False)
    except OSError:
        return changed  # none (ENODATA), or a filesystem without ACLs: the mode says it all
    os.removexattr(path, _ACL_XATTR, follow_symlinks=False)  # an ACL the mode does not show (mask 0)
    os.chmod(path, want_mode)
    return True


def grant(host_root: Path, sl: Slice, uid: int) -> list[str]:
    """Give the slice's nodes to ``uid`` alone (an ACL entry; the node stays root's); returns warnings."""
    warnings = []
    for node in cap_nodes(host_root, sl):
        _restrict(node.device, FREE_MODE >> 6, {uid: 4})
        if node.modify:
            warnings.append(
                f"{node.access_file} says DeviceFileModify: 1, so the driver may reset {node.device}; "
                "set 'options nvidia NVreg_ModifyDeviceFiles=0'"
            )
    if sl.kind == "mps" and sl.pipe_directory:
        pipe = Path(sl.pipe_directory)
        if pipe.is_dir():
            users = acl_users(pipe)
            users[uid] = 7
            _restrict(pipe, 7, users)
    return warnings


def close_node(path: Path, holder: int | None) -> bool:
    """One node: root's, readable by ``holder`` alone (or by nobody but root); True when changed."""
    return _restrict(path, FREE_MODE >> 6, {holder: 4} if holder is not None else {})


def revoke(host_root: Path, sl: Slice) -> None:
    for node in cap_nodes(host_root, sl):
        _restrict(node.device, FREE_MODE >> 6, {})


def set_pipe_holders(pipe_directory: str, uids: set[int]) -> None:
    """An MPS daemon's pipe directory: root's, reachable by exactly ``uids`` (the slots' holders)."""
    pipe = Path(pipe_directory)
    if pipe.is_dir():
        _restrict(pipe, 7, dict.fromkeys(uids, 7))


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
