"""Stand-in NVIDIA packages with the real names and versions, in a local apt repository, for role tests.

Nothing here touches a GPU or NVIDIA's servers: ``build_repo(out)`` writes ``.deb`` files (``dpkg-deb``)
and a flat index (``dpkg-scanpackages``) that a booted test host reads as
``deb [trusted=yes] file:<dir> ./``. The packages behave like the driver where the role can see it:

- ``nvidia-open`` ships ``/usr/bin/nvidia-smi``, which fails as the real one does while no module is
  loaded, and reports the version once ``nvidia-standin-load.service`` has "loaded" it at boot (it
  writes ``/run/nvidia-standin/loaded-version``, and /run is emptied by a reboot, as a module is
  unloaded); ``nvidia-persistenced`` (a process that records its arguments) and its unit; the stand-in
  ``nvidia-cuda-mps-control`` of tests/gpu/bin.
- ``nvidia-driver-pinning-<branch>``, ``nvidia-fabricmanager`` (with its unit), ``libnvidia-nscq``,
  ``cuda-keyring`` and ``linux-headers-<kernel>`` are empty packages under the same names and versions.

``detection_smi(version)`` is the text of a stand-in ``nvidia-smi`` for a host that already has a working
driver (an AWS Deep Learning AMI): it always answers ``version``; ``build_repo`` also writes it beside the
index as ``nvidia-smi-working`` (not a package) for the scenario's prepare step.

Usage (a molecule prepare step): ``python tests/roles/nvidia_standins.py OUT_DIR --kernel "$(uname -r)"``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

DRIVER_VERSION = "580.105.08"  # a 580 (production branch) release
DEB_REVISION = "1"
KEYRING_VERSION = "1.1-1"
MPS_STANDIN = Path(__file__).resolve().parents[1] / "gpu" / "bin" / "nvidia-cuda-mps-control"

_SMI = """#!/bin/sh
# Stand-in nvidia-smi (calque tests): answers only once the stand-in driver is "loaded" (at boot).
loaded=/run/nvidia-standin/loaded-version
if [ ! -s "$loaded" ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." \
    "Make sure that the latest NVIDIA driver is installed and running."
  exit 9
fi
case "$*" in
  *--query-gpu=driver_version*) cat "$loaded" ;;
  *) echo "NVIDIA-SMI $(cat "$loaded")  Driver Version: $(cat "$loaded") (stand-in)" ;;
esac
"""

_DETECTION_SMI = """#!/bin/sh
# Stand-in nvidia-smi (calque tests) for a host whose driver already works, as on an AWS Deep Learning AMI.
case "$*" in
  *--query-gpu=driver_version*) echo "{version}" ;;
  *) echo "NVIDIA-SMI {version}  Driver Version: {version} (stand-in)" ;;
esac
"""

_PERSISTENCED = """#!/bin/sh
# Stand-in nvidia-persistenced (calque tests): records how it was started, then stays up.
mkdir -p /run/nvidia-standin
echo "$*" > /run/nvidia-standin/persistenced-args
exec sleep infinity
"""

_PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon (stand-in)

[Service]
Type=simple
ExecStart=/usr/bin/nvidia-persistenced --verbose

[Install]
WantedBy=multi-user.target
"""

_LOAD_UNIT = """[Unit]
Description=Stand-in for loading the NVIDIA kernel module at boot (calque tests)
DefaultDependencies=no
Before=nvidia-persistenced.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'mkdir -p /run/nvidia-standin && echo {version} > /run/nvidia-standin/loaded-version'

[Install]
WantedBy=multi-user.target
"""

_FABRICMANAGER_UNIT = """[Unit]
Description=NVIDIA fabric manager service (stand-in)

[Service]
Type=simple
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""


_SYMLINK = -1  # a files entry whose content is the link target


def detection_smi(version: str = DRIVER_VERSION) -> str:
    return _DETECTION_SMI.format(version=version)


def _deb(out: Path, name: str, version: str, files: dict[str, tuple[str, int]], description: str) -> Path:
    """Build one package whose payload is ``files`` (path -> (content, mode))."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / name
        (root / "DEBIAN").mkdir(parents=True)
        (root / "DEBIAN" / "control").write_text(
            f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: calque tests <tests@calque.invalid>\n"
            f"Section: misc\nPriority: optional\nDescription: {description} (calque test stand-in)\n"
        )
        for rel, (content, mode) in files.items():
            path = root / rel.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            if mode == _SYMLINK:
                path.symlink_to(content)
                continue
            path.write_text(content)
            path.chmod(mode)
        deb = out / f"{name}_{version}_all.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)], check=True,
                       capture_output=True)  # fmt: skip
        return deb


def build_repo(out: Path, *, kernel: str, branch: int = 580, version: str = DRIVER_VERSION) -> Path:
    """Write the stand-in packages and their index into ``out``; returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    full = f"{version}-{DEB_REVISION}"
    load_unit = _LOAD_UNIT.format(version=version)
    _deb(out, "nvidia-open", full, {
        "/usr/bin/nvidia-smi": (_SMI, 0o755),
        "/usr/bin/nvidia-persistenced": (_PERSISTENCED, 0o755),
        "/usr/bin/nvidia-cuda-mps-control": (MPS_STANDIN.read_text(), 0o755),
        "/lib/systemd/system/nvidia-persistenced.service": (_PERSISTENCED_UNIT, 0o644),
        "/lib/systemd/system/nvidia-standin-load.service": (load_unit, 0o644),
        # Enabled the way a package's postinst would enable it, so a reboot "loads" the module.
        "/etc/systemd/system/multi-user.target.wants/nvidia-standin-load.service": (
            "/lib/systemd/system/nvidia-standin-load.service",
            _SYMLINK,
        ),
    }, "NVIDIA driver metapackage with open kernel modules")  # fmt: skip
    _deb(out, f"nvidia-driver-pinning-{branch}", full, {}, f"pins apt to the NVIDIA {branch} driver branch")
    _deb(out, "nvidia-fabricmanager", full, {
        "/lib/systemd/system/nvidia-fabricmanager.service": (_FABRICMANAGER_UNIT, 0o644),
    }, "Fabric Manager for NVSwitch based systems")  # fmt: skip
    _deb(out, "libnvidia-nscq", full, {}, "NVSwitch Configuration and Query library")
    _deb(out, "cuda-keyring", KEYRING_VERSION, {}, "GPG keyring for the CUDA repository")
    _deb(out, f"linux-headers-{kernel}", "1", {}, f"Linux kernel headers for {kernel}")
    index = subprocess.run(["dpkg-scanpackages", "--multiversion", ".", "/dev/null"], cwd=out, check=True,
                           capture_output=True, text=True).stdout  # fmt: skip
    (out / "Packages").write_text(index)
    # Not a package: what a host with a working driver (a Deep Learning AMI) has as nvidia-smi.
    (out / "nvidia-smi-working").write_text(detection_smi(version))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--kernel", required=True, help="the test host's kernel release (uname -r)")
    parser.add_argument("--branch", type=int, default=580)
    parser.add_argument("--version", default=DRIVER_VERSION)
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    print(build_repo(args.out, kernel=args.kernel, branch=args.branch, version=args.version))


if __name__ == "__main__":
    main()
