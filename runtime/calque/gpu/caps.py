"""MIG capability device nodes: which ``/dev/nvidia-caps/nvidia-capN`` files give access to a MIG device.

A process reaches a MIG device through the GPU instance's and the compute instance's ``access``
capabilities. The driver publishes them as ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access``
and ``.../gi<G>/ci<C>/access``, each holding ``DeviceFileMinor: N``; the node is then
``/dev/nvidia-caps/nvidia-capN``. The session service grants a user those nodes (plus the GPU's own
``/dev/nvidia<minor>``) and no others. The simulator writes the same files under its root directory.
"""

from __future__ import annotations

import re
from pathlib import Path

from calque.errors import InfrastructureError
from calque.models import MigDevice

# The driver's fixed minor numbering (``/proc/driver/nvidia-caps/mig-minors``): config=1, monitor=2,
# then per GPU 15 GPU instances, each with its access node followed by 8 compute-instance nodes.
_BASE, _PER_GI, _GIS = 3, 9, 15


def cap_minor(gpu_minor: int, gi_id: int, ci_id: int | None = None) -> int:
    """The nvidia-cap minor of a GI's (or, with ``ci_id``, a CI's) access capability."""
    minor = _BASE + gpu_minor * _PER_GI * _GIS + gi_id * _PER_GI
    return minor if ci_id is None else minor + 1 + ci_id


def proc_access_files(root: Path, gpu_minor: int, gi_id: int, ci_id: int) -> tuple[Path, Path]:
    base = root / "proc/driver/nvidia/capabilities" / f"gpu{gpu_minor}" / "mig" / f"gi{gi_id}"
    return base / "access", base / f"ci{ci_id}" / "access"


def access_file_text(minor: int) -> str:
    """What the driver shows in a capability ``access`` file (mode 292 = 0444)."""
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"


def _read_minor(path: Path) -> int:
    try:
        text = path.read_text(encoding="ascii")
    except OSError as exc:
        raise InfrastructureError(
            f"cannot read MIG capability {path}: {exc.strerror}; is the MIG device still present "
            "(see `calque gpu info`)?"
        ) from exc
    m = re.search(r"^DeviceFileMinor:\s*(\d+)", text, re.MULTILINE)
    if m is None:
        raise InfrastructureError(f"{path} has no DeviceFileMinor line; unexpected driver format")
    return int(m.group(1))


def mig_capability_devices(mig: MigDevice, root: Path | str = "/") -> list[Path]:
    """The capability device nodes (GI access, then CI access) a process needs to use ``mig``.

    Read from the driver's proc files under ``root`` (``/`` on a host, the simulator's root in tests).
    """
    root = Path(root)
    gi_file, ci_file = proc_access_files(root, mig.gpu_minor, mig.gi_id, mig.ci_id)
    return [root / "dev/nvidia-caps" / f"nvidia-cap{_read_minor(f)}" for f in (gi_file, ci_file)]
