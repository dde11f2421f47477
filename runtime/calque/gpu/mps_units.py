"""The systemd units that run MPS control daemons at boot: ``calque-mps@<gpu>.service`` under ``calque-mps.target``.

``ExecStart`` names calque by its absolute path: systemd's PATH holds no virtualenv, so
``/usr/bin/env calque`` would fail on a host where calque lives in ``/opt/calque/venv``. The path
defaults to the ``calque`` beside the running interpreter (the venv that runs this code); the
``gpu_layout`` role passes its venv's explicitly (``calque gpu mps unit --calque PATH --json``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from calque.errors import UsageError
from calque.models.base import CalqueModel

SERVICE = "calque-mps@.service"
TARGET = "calque-mps.target"

_SERVICE = """\
# calque MPS control daemon for one GPU; the instance is the GPU index (calque-mps@0).
# Enabled under calque-mps.target: systemctl enable calque-mps@0 && systemctl start calque-mps.target
# MPS gives no isolation between clients; enabling this unit is the consent.
[Unit]
Description=calque MPS control daemon for GPU %i
After=nvidia-persistenced.service calque-gpu.service
Before=calque-session.service
PartOf=calque-mps.target
ConditionPathExists=/usr/bin/nvidia-cuda-mps-control

[Service]
Type=oneshot
RemainAfterExit=yes
Environment=CALQUE_HOST_CONFIG=/etc/calque/host.yaml
EnvironmentFile=-/etc/calque/mps.env
ExecStart={calque} gpu mps start --gpus %i $CALQUE_MPS_OPTIONS --i-understand-shared-gpu-has-no-isolation
ExecStop={calque} gpu mps stop --gpus %i --i-understand-shared-gpu-has-no-isolation

[Install]
WantedBy=calque-mps.target
"""

_TARGET = """\
# calque MPS daemons: every enabled calque-mps@<gpu>.service. The session service starts after it.
[Unit]
Description=calque MPS control daemons
After=calque-gpu.service
Before=calque-session.service

[Install]
WantedBy=multi-user.target
"""


class MpsUnits(CalqueModel):
    """The unit files, by file name, for a calque at ``calque``."""

    version: int = 1
    calque: str
    units: dict[str, str]


def default_calque() -> Path:
    """The ``calque`` script of the environment that runs this interpreter (``<venv>/bin/calque``)."""
    return Path(sys.executable).parent / "calque"


def mps_units(calque: Path | str | None = None) -> MpsUnits:
    """``calque-mps@.service`` and ``calque-mps.target`` with ``ExecStart`` naming ``calque`` absolutely."""
    path = Path(calque) if calque is not None else default_calque()
    if not path.is_absolute():
        # systemd needs an absolute ExecStart; a relative path would be resolved against nothing.
        raise UsageError(f"calque path {path} is not absolute; give the full path, e.g. /opt/calque/venv/bin/calque")
    return MpsUnits(calque=str(path), units={SERVICE: _SERVICE.format(calque=path), TARGET: _TARGET})
