"""The GPU shapes a test host can stand for: simulated cards named as in calque's GPU catalog.

Each becomes the host's ``calque_runtime_gpu_backend: sim`` and ``calque_runtime_gpu_sim`` inventory
variables, which the ``runtime`` role writes into the ``gpu:`` section of ``/etc/calque/host.yaml``.
The simulator's state lives under /run (a tmpfs in the container), so a restarted host comes back
with MIG mode still on but no MIG instances, as a real GPU does after a reboot; its own directory
(not /run/calque) so that a unit's ``RuntimeDirectory=calque`` never removes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SIM_STATE = "/run/calque-sim/gpus.json"


@dataclass(frozen=True)
class Shape:
    name: str
    sharing: str  # mig | mps: how the institution shares this host's GPUs
    describes: str
    cards: tuple[str, ...] = ()
    instance_type: str | None = None
    mig: bool = False

    def gpu_sim(self) -> dict[str, Any]:
        sim: dict[str, Any] = {"state": SIM_STATE, "mig": self.mig}
        if self.instance_type:
            sim["instance_type"] = self.instance_type
        else:
            sim["cards"] = list(self.cards)
        return sim

    def host_vars(self) -> dict[str, Any]:
        if not (self.cards or self.instance_type):
            return {}
        return {"calque_runtime_gpu_backend": "sim", "calque_runtime_gpu_sim": self.gpu_sim()}


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape(
            "rtx-pro-6000",
            "mig",
            "one RTX PRO 6000 Blackwell Server Edition in MIG mode (a teaching host)",
            cards=("RTX-PRO-6000-Blackwell-Server-Edition",),
            mig=True,
        ),
        Shape("p5.48xlarge", "mig", "8x H100 80GB in MIG mode (p5.48xlarge)", instance_type="p5.48xlarge", mig=True),
        Shape("l40s", "mps", "one L40S 48GB shared through MPS (a research host)", cards=("L40S-48GB",)),
        Shape("none", "none", "no GPUs (a host that only runs services)"),
    )
}


def shape(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown host shape {name!r}; use one of {', '.join(SHAPES)}") from None
