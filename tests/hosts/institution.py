"""Booted hosts dressed as an institution's: the institution inventory's own group_vars over a run's
hosts, and hosts that stand for an AWS Deep Learning AMI (a working driver, NVIDIA's repository
configured), for the e2e test and the sandbox.

Only what a test host must differ in is overridden: the wheelhouse (this checkout's), the driver's
repository (the stand-in one of tests/roles), carrying on before the driver's pending reboot, and the
number of L40S cards in the MPS slot list.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from .fleet import Fleet
from .paths import REPO

INSTITUTION = REPO / "playbooks" / "inventories" / "institution"
SITE = REPO / "playbooks" / "site.yml"
STANDIN_SOURCE = "deb [trusted=yes] file:/srv/nvidia-standin ./"


def prepare_dlami(fleet: Fleet, hosts: list[str] | None = None) -> None:
    """Every host (or those named: a front door has no GPU) gets what an AWS Deep Learning AMI ships:
    NVIDIA's repository configured (here the stand-in one of tests/roles) and the driver installed and
    loaded (the stand-in ``nvidia-open``: ``nvidia-smi`` answering 580, ``nvidia-persistenced``,
    ``nvidia-cuda-mps-control``)."""
    # Built into the run's own folder: booted modules run side by side, and one shared folder was
    # rebuilt by one run while another copied it (both runs' setups failed).
    standins = fleet.dir / "nvidia-standin"
    names = [h.name for h in fleet.hosts if hosts is None or h.name in hosts]
    kernel = fleet.ssh(names[0], "uname -r").stdout.strip()
    subprocess.run(
        [sys.executable, str(REPO / "tests/roles/nvidia_standins.py"), str(standins), "--kernel", kernel],
        check=True,
        capture_output=True,
        timeout=300,
    )

    def install(name: str) -> None:
        fleet.scp_to(name, standins, "/srv/nvidia-standin")
        fleet.ssh(
            name,
            f"echo '{STANDIN_SOURCE}' > /etc/apt/sources.list.d/nvidia.list && apt-get update -qq && "
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nvidia-open >/dev/null && "
            "systemctl daemon-reload && systemctl start nvidia-standin-load.service && nvidia-smi >/dev/null",
            timeout=300,
        )

    with ThreadPoolExecutor(max_workers=len(names)) as pool:  # the hosts are independent: side by side
        list(pool.map(install, names))  # list(): the first failure is raised here


def run_institution(fleet: Fleet, frontdoor: str, offers: dict[str, list[str]] | None = None) -> dict[str, object]:
    """The institution inventory's ``calque_session_service_institution`` with the run's hosts in place
    of example.edu's: every session host at its address (port 7461, what ``offers`` names for it, else
    its group's offers), the broker on ``frontdoor``; the labs are the inventory's."""
    example = yaml.safe_load((INSTITUTION / "group_vars" / "all.yml").read_text())["calque_session_service_institution"]
    by_group = {"teaching": ["1g.24gb"], "research": ["mps"]}
    hosts = [
        {"name": h.name, "address": h.address, "port": 7461, "offers": (offers or {}).get(h.name, by_group[g])}
        for h in fleet.hosts
        for g in h.groups
        if g in by_group
    ]
    front = fleet.host(frontdoor)
    broker = {"name": front.name, "address": front.address, "port": 7460, "service_user": "root"}
    return {"hosts": hosts, "broker": broker, "labs": example["labs"]}


def institution_inventory(
    fleet: Fleet,
    wheelhouse: Path,
    *,
    host_vars: dict[str, dict[str, object]] | None = None,
    institution: dict[str, object] | None = None,
) -> tuple[Path, Path]:
    """An inventory folder (the run's hosts, the institution's groups and group_vars) and an extra-vars
    file for ``-e @``; returns both paths. The run's hosts carry their groups (teaching, research, and
    calque_session_frontdoor for a front door); ``institution`` (``run_institution``) replaces the
    inventory's example.edu institution."""
    folder = fleet.dir / "institution"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(INSTITUTION / "group_vars", folder / "group_vars")
    for pool_vars in ("lab_a.yml", "lab_b.yml", "calque_pool_hosts.yml"):
        (folder / "group_vars" / pool_vars).unlink(missing_ok=True)
    shutil.copy(fleet.inventory, folder / "hosts.yml")
    groups = {
        "calque_gpu_hosts": {"children": {"teaching": None, "research": None}},
        "calque_session_hosts": {"children": {"teaching": None, "research": None}},
    }
    (folder / "groups.yml").write_text(yaml.safe_dump(groups))
    (folder / "host_vars").mkdir()
    for host, values in (host_vars or {}).items():
        (folder / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(values))
    extra = fleet.dir / "institution-vars.yml"  # outside the folder: inside, ansible would read it as inventory
    test_host = {
        "calque_runtime_wheelhouse": str(wheelhouse),
        "calque_nvidia_driver_apt_source": STANDIN_SOURCE,
        # The role's modprobe option waits for a reboot; these hosts' GPUs are the simulator, usable before it.
        "calque_nvidia_driver_continue_before_reboot": True,
    }
    if institution is not None:
        test_host["calque_session_service_institution"] = institution
    extra.write_text(yaml.safe_dump(test_host))
    return folder, extra


def one_gpu_mps_slots() -> list[dict[str, object]]:
    """The research group's MPS slots of GPU 0 only (a test host has one L40S, the inventory's four)."""
    research = yaml.safe_load((INSTITUTION / "group_vars" / "research.yml").read_text())
    return [slot for slot in research["calque_session_service_mps"] if slot["gpu"] == 0]
