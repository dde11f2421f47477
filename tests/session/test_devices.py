"""The device allow-list a session's systemd scope carries (devices.py)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from calque.models.session import Slice
from calque.session.daemon.devices import allow_list, groups_not_starting_with, scope_properties

# /proc/devices "Character devices:" names of a GPU host (nvidia-frontend on older branches, nvidia on newer)
CHAR_GROUPS = [
    "mem", "/dev/vc/0", "tty", "ttyS", "/dev/tty", "/dev/console", "/dev/ptmx", "ppp", "vcs", "misc",
    "input", "fb", "ptm", "pts", "usb", "hidraw", "nvme-generic", "nvme", "bsg", "watchdog", "rtc",
    "dax", "dimmctl", "ndctl", "tpm", "fuse", "n", "nv", "nvi", "nvid", "nvidi",
    "nvidia-frontend", "nvidia", "nvidia-uvm", "nvidia-caps", "nvidia-nvswitch", "nvidia-nvlink",
    "nvidia-caps-imex-channels",
]  # fmt: skip


def _allowed(name: str, entries: list[tuple[str, str]]) -> bool:
    return any(spec.startswith("char-") and fnmatch.fnmatchcase(name, spec[5:]) for spec, _ in entries)


def _mig_host(tmp_path: Path, nodes_are_devices: bool) -> tuple[Path, Slice]:
    root = tmp_path / "host"
    caps = root / "proc/driver/nvidia/capabilities/gpu3/mig/gi2"
    (caps / "ci0").mkdir(parents=True)
    (caps / "access").write_text("DeviceFileMinor: 57\nDeviceFileMode: 292\nDeviceFileModify: 0\n")
    (caps / "ci0" / "access").write_text("DeviceFileMinor: 58\nDeviceFileMode: 292\nDeviceFileModify: 0\n")
    (root / "dev/nvidia-caps").mkdir(parents=True)
    for node in ("nvidiactl", "nvidia3", "nvidia4", "nvidia-caps/nvidia-cap57", "nvidia-caps/nvidia-cap58"):
        if nodes_are_devices:  # a real character device stands in for each node (stat follows the link)
            (root / "dev" / node).symlink_to("/dev/null")
        else:  # the simulator's nodes are plain files
            (root / "dev" / node).write_text("")
    sl = Slice(
        id="MIG-aaaa", kind="mig", gpu_index=3, gpu_uuid="GPU-3", profile="1g.24gb", gpu_minor=3, gi_id=2, ci_id=0
    )
    return root, sl


def test_the_patterns_match_every_driver_but_nvidias() -> None:
    patterns = groups_not_starting_with("nvidia")
    for name in CHAR_GROUPS:
        matched = any(fnmatch.fnmatchcase(name, p) for p in patterns)
        assert matched != name.startswith("nvidia"), name


def test_a_mig_session_opens_its_own_gpu_and_capability_nodes_and_no_other(tmp_path: Path) -> None:
    root, sl = _mig_host(tmp_path, nodes_are_devices=True)
    entries = allow_list(root, sl)
    paths = {spec for spec, _ in entries if spec.startswith("/")}
    dev = root / "dev"
    assert paths == {
        str(dev / n) for n in ("nvidiactl", "nvidia3", "nvidia-caps/nvidia-cap57", "nvidia-caps/nvidia-cap58")
    }
    assert _allowed("nvidia-uvm", entries) and _allowed("fuse", entries) and _allowed("/dev/ptmx", entries)
    for group in ("nvidia-frontend", "nvidia", "nvidia-caps", "nvidia-nvswitch", "nvidia-caps-imex-channels"):
        assert not _allowed(group, entries), group  # only by path: the slice's GPU and its two capabilities
    assert all(access == "rwm" for _, access in entries)


def test_an_mps_slot_opens_every_gpu_node_but_no_mig_capability(tmp_path: Path) -> None:
    sl = Slice(id="mps-gpu0-slot1", kind="mps", gpu_index=0, gpu_uuid="GPU-0", profile="mps", slot=1)
    entries = allow_list(tmp_path, sl)
    assert _allowed("nvidia-frontend", entries) and _allowed("nvidia", entries) and _allowed("nvidia-uvm", entries)
    assert not _allowed("nvidia-caps", entries)
    assert not any(spec.startswith("/") for spec, _ in entries)


def test_a_simulated_hosts_plain_files_are_not_listed(tmp_path: Path) -> None:
    root, sl = _mig_host(tmp_path, nodes_are_devices=False)
    assert not any(spec.startswith("/") for spec, _ in allow_list(root, sl))


def test_the_scope_properties_are_busctl_arguments_systemd_reads(tmp_path: Path) -> None:
    root, sl = _mig_host(tmp_path, nodes_are_devices=True)
    policy, allow = scope_properties(root, sl)
    assert policy == ("DevicePolicy", "s", "closed")
    name, sig, count, *pairs = allow
    assert (name, sig) == ("DeviceAllow", "a(ss)")
    assert int(count) * 2 == len(pairs) and list(zip(pairs[::2], pairs[1::2], strict=True)) == allow_list(root, sl)
