"""calque.gpu.preflight: every calque variable of every host checked before any host changes.

Real ``ansible-playbook`` runs of ``site.yml`` and ``pool.yml`` from the checkout, against an inventory
whose hosts point at a closed port on 127.0.0.1: a play that went past the preflight would have to
connect, and shows as unreachable. Misspelled and invalid variables fail the first play with
changed=0 on every host, no host contacted, and each problem named by its variable and file.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from test_checkout_config import INSTITUTION, REPO, SANDBOX, ansible

pytestmark = pytest.mark.slow
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
CLOSED = {"ansible_host": "127.0.0.1", "ansible_port": 9, "ansible_connection": "ssh"}


def recap(out: str) -> dict[str, dict[str, int]]:
    keys = ("ok", "changed", "unreachable", "failed")
    return {m[1]: dict(zip(keys, map(int, m.groups()[1:]), strict=True)) for m in RECAP.finditer(out)}


def _inventory(tmp_path: Path, teaching: dict[str, object]) -> Path:
    """Two teaching hosts and one research host (unreachable) with the institution's group_vars, plus ``teaching``."""
    folder = tmp_path / "inventory"
    shutil.copytree(REPO / "playbooks/inventories/institution/group_vars", folder / "group_vars")
    hosts = {
        "all": {
            "children": {
                "calque_gpu_hosts": {"children": {"teaching": None, "research": None}},
                "calque_session_hosts": {"children": {"teaching": None, "research": None}},
                "teaching": {"hosts": {"teach0": CLOSED, "teach1": CLOSED}},
                "research": {"hosts": {"research0": CLOSED}},
            }
        }
    }
    (folder / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (folder / "host_vars").mkdir()
    (folder / "host_vars" / "teach1.yml").write_text(yaml.safe_dump(teaching))
    return folder


BAD = {
    "calque_session_service_max_totl_ttl": "3h",
    "calque_session_service_default_ttl": "2hours",
    "calque_session_service_settings": {"notice_befor": 60},
    "calque_gpu_layout_allow_reset": "maybe",
    "calque_gpu_layout_mig_configs": {"broken": [{"mig-enabled": True, "mig-devics": {"1g.24gb": 4}}]},
}


@pytest.mark.parametrize("check", [False, True], ids=["real", "check"])
def test_site_stops_at_the_first_play_naming_each_variable_and_its_file(tmp_path: Path, check: bool) -> None:
    inventory = _inventory(tmp_path, BAD)
    before = {p: p.read_bytes() for p in inventory.rglob("*") if p.is_file()}
    args = ["-i", str(inventory), "playbooks/site.yml", *(["--check", "--diff"] if check else [])]
    r = ansible(tmp_path, "ansible-playbook", *args)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    where = f"(set in {inventory}/host_vars/teach1.yml)"
    assert f"calque_session_service_max_totl_ttl {where}: unknown variable; did you mean" in out
    assert "did you mean calque_session_service_max_total_ttl?" in out
    assert f"calque_session_service_default_ttl {where}: '2hours' is not a duration" in out
    assert "calque_session_service_settings.notice_befor" in out and "did you mean notice_before?" in out
    assert f"calque_gpu_layout_allow_reset {where}: " in out and "not a valid boolean" in out
    assert "calque_gpu_layout_mig_configs.broken" in out
    assert "mig-devics" in out and "[teach1]" in out
    totals = recap(out)
    assert set(totals) == {"teach0", "teach1", "research0"}
    assert all(t["changed"] == 0 and t["unreachable"] == 0 for t in totals.values()), totals
    assert "PLAY [GPU hosts" not in out  # no later play started
    assert {p: p.read_bytes() for p in inventory.rglob("*") if p.is_file()} == before


def test_an_inventory_of_valid_variables_passes(tmp_path: Path) -> None:
    r = ansible(tmp_path, "ansible-playbook", "-i", INSTITUTION, "calque.gpu.preflight", "--check", "-v")
    assert r.returncode == 0, r.stdout + r.stderr
    # six hosts: the teaching, research and lab hosts, and the front door
    assert re.search(r"checked \d+ calque variable\(s\) of 6 host\(s\)", r.stdout), r.stdout
    assert all(t["failed"] == 0 and t["changed"] == 0 for t in recap(r.stdout).values())


def test_pool_yml_checks_its_variables_before_the_spend_gate(tmp_path: Path) -> None:
    folder = tmp_path / "sandbox"
    shutil.copytree(REPO / Path(SANDBOX).parent, folder)
    group_vars = folder / "group_vars" / "all.yml"
    doc = yaml.safe_load(group_vars.read_text())
    doc["calque_i_understand_this_spends_mony"] = True
    doc["calque_max_hourly_usd"] = "lots"
    group_vars.write_text(yaml.safe_dump(doc))
    r = ansible(tmp_path, "ansible-playbook", "-i", str(folder / "hosts.yml"), "playbooks/pool.yml", "--check")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "did you mean calque_i_understand_this_spends_money?" in out
    assert f"calque_max_hourly_usd (set in {group_vars})" in out
    assert "PLAY [Warm pool on the controller]" not in out
    assert all(t["changed"] == 0 for t in recap(out).values())
