"""The harness itself: hosts boot systemd, answer real ssh only from the controller namespace, and
leave nothing behind (namespaces, processes, mounts, files) after teardown or a crashed run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from . import netns, procs
from .fleet import HostSpec
from .machine import mounts_under
from .paths import HANG_S, NETNS_PREFIX, REPO, RUNS_DIR

pytestmark = [pytest.mark.hosts, pytest.mark.slow]


def _normal(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _leftovers(name: str, pids: list[tuple[int, int | None]]) -> list[str]:
    left = [f"netns {n}" for n in netns.list_namespaces(f"{NETNS_PREFIX}{name}-")]
    left += [f"pid {p} {procs.cmdline(p)[:2]}" for p, s in pids if procs.alive(p, s)]
    left += [f"mount {m}" for m in mounts_under(RUNS_DIR / name)]
    left += [f"dir {RUNS_DIR / name}"] if (RUNS_DIR / name).exists() else []
    return left


def test_two_hosts_boot_systemd_answer_ssh_from_the_controller_only_and_leave_nothing(boot_hosts) -> None:
    f = boot_hosts(
        "smoke",
        [HostSpec("alpha", "rtx-pro-6000", ("calque_gpu_hosts",)), HostSpec("beta", "l40s", ("calque_gpu_hosts",))],
    )
    for h in f.hosts:
        r = f.ssh(
            h.name, "systemctl is-system-running; hostname; cat /proc/1/comm; ip -4 -o addr show eth0", check=False
        )
        state, hostname, init, addr = r.stdout.splitlines()
        assert state == "running", f"{h.name}: {state}\n" + f.ssh(h.name, "systemctl --failed", check=False).stdout
        assert (hostname, init) == (h.name, "systemd")
        assert f" {h.address}/24 " in addr
        # Hosts reach no network beyond the run (no route anywhere else: no package index either).
        unreachable = f.ssh(h.name, "ip route get 1.1.1.1", check=False)
        assert unreachable.returncode != 0 and "unreachable" in unreachable.stderr.lower()

    # The inventory works for ansible, which runs (with its ssh) in the controller namespace.
    ping = f.controller(
        [
            str(REPO / ".venv/bin/ansible"),
            "-i",
            str(f.inventory),
            "calque_gpu_hosts",
            "-m",
            "ansible.builtin.ping",
            "-o",
        ],
        env=f.ansible_env(),
        cwd=REPO,
        timeout=120,
    )
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert sorted(line.split()[0] for line in ping.stdout.splitlines() if "SUCCESS" in line) == ["alpha", "beta"]

    # The addresses exist nowhere but in the run's namespaces: not in the root namespace, and a
    # namespace the run did not wire (a probe) cannot reach them (no packet leaves: no route).
    assert netns.root_addresses_in_test_range() == []
    probe = f"{NETNS_PREFIX}smoke-probe"
    netns.ip("netns", "add", probe)
    try:
        netns.ip("link", "set", "lo", "up", netns=probe)
        code = "import socket\ntry:\n socket.create_connection(('%s', 22), 3)\nexcept OSError as e:\n print(e.errno)"
        r = subprocess.run(
            ["ip", "netns", "exec", probe, sys.executable, "-c", code % f.hosts[0].address],
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
        assert r.stdout.strip() == "101", r  # ENETUNREACH
    finally:
        netns.delete(probe)

    tracked = [(h.pid or 0, h.started) for h in f.hosts]
    tracked += [(p, procs.start_time(p)) for p in netns.pids_in(f.controller_ns)]  # ssh control masters
    assert len(tracked) > 2 and all(procs.alive(p, s) for p, s in tracked)
    removed = f.down()
    assert {"host alpha", "host beta", f"netns {f.controller_ns}"} <= set(removed)
    assert _leftovers("smoke", tracked) == []


def test_down_all_removes_what_a_run_without_its_state_left(host_image: Path, tmp_path: Path) -> None:
    """A run brought up by the CLI (detached), whose state file is then lost as in a crash, is still
    found by ``down --all`` through its namespaces and its systemd-nspawn command line. It runs with
    its own CALQUE_HOSTS_DIR (so its own namespace prefix): ``--all`` never touches other runs."""
    hosts_dir = (tmp_path / "hosts").resolve()
    env = {**os.environ, "CALQUE_HOSTS_DIR": str(hosts_dir)}
    prefix = f"cth-{hashlib.sha256(str(hosts_dir).encode()).hexdigest()[:6]}-"
    assert prefix != NETNS_PREFIX
    cli = [str(REPO / ".venv/bin/python"), "-m", "tests.hosts"]
    up = subprocess.run(
        [*cli, "up", "--name", "crashed", "--host", "gamma=none", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env=env,
    )
    assert up.returncode == 0, up.stderr
    run = json.loads(up.stdout)
    state_file = hosts_dir / "runs" / "crashed" / "state.json"
    host = json.loads(state_file.read_text())["hosts"][0]
    assert procs.alive(host["pid"], host["started"]) and run["hosts"][0]["address"] == netns.host_address(0)
    assert netns.list_namespaces(prefix) == [f"{prefix}crashed-0", f"{prefix}crashed-c"]
    state_file.unlink()

    down = subprocess.run([*cli, "down", "--all"], capture_output=True, text=True, cwd=REPO, timeout=120, env=env)
    assert down.returncode == 0, down.stderr
    assert "removed systemd-nspawn pid" in down.stdout and f"removed netns {prefix}crashed-c" in down.stdout
    assert netns.list_namespaces(prefix) == []
    assert not procs.alive(host["pid"], host["started"])
    assert mounts_under(hosts_dir) == [] and not (hosts_dir / "runs" / "crashed").exists()


def test_the_runtime_layer_holds_exactly_the_pinned_dependencies_and_no_calque(
    host_image: Path, wheelhouse: Path
) -> None:
    """The layer hosts boot with when their test is not the runtime's install (runtime_layer.py): the role's
    virtualenv, made by the image's own Python, with every pin of the wheelhouse but calque and nothing else."""
    from .runtime_layer import VENV, ensure_runtime_layer, layer_key

    layer = ensure_runtime_layer(host_image, wheelhouse)
    assert ensure_runtime_layer(host_image, wheelhouse) == layer  # built once, then found
    venv = layer / VENV.lstrip("/")
    assert os.readlink(venv / "bin" / "python3").endswith("python3")
    assert (venv / "pyvenv.cfg").read_text().count("home = /usr/bin") == 1  # the image's interpreter
    site = next((venv / "lib").glob("python3.*/site-packages"))
    names = [p.name.removesuffix(".dist-info").rsplit("-", 1) for p in site.glob("*.dist-info")]
    installed = {name.lower().replace("_", "-"): version for name, version in names}
    pins = dict(line.split("==") for line in (wheelhouse / "requirements.txt").read_text().split() if "==" in line)
    wanted = {n.lower().replace("_", "-"): v for n, v in pins.items() if n != "calque"}
    assert "calque" not in installed
    assert {n: v for n, v in installed.items() if n not in ("pip", "setuptools")} == wanted
    assert not (layer / "tmp" / "calque-runtime-deps").exists()  # the staged wheels are not kept
    assert len(layer_key(host_image, wheelhouse)) == 16


def test_the_notebooks_layer_holds_the_extra_over_the_dependency_layer_and_not_the_role_marker(
    host_image: Path, wheelhouse: Path
) -> None:
    """The layer the estate's notebook hosts boot with (runtime_layer.py): what the role's notebooks pip adds
    to the venv over the dependency layer (jupyterhub-singleuser among it), and neither calque nor the role's
    marker, so the role's notebooks block still runs whole on those hosts."""
    from .runtime_layer import VENV, ensure_notebooks_layer, ensure_runtime_layer, layers_for

    layer = ensure_notebooks_layer(host_image, wheelhouse)
    assert ensure_notebooks_layer(host_image, wheelhouse) == layer  # built once, then found
    deps = ensure_runtime_layer(host_image, wheelhouse)
    assert layers_for(host_image, wheelhouse, notebooks=True) == (layer, deps)  # uppermost first
    assert layers_for(host_image, wheelhouse, notebooks=False) == (deps,)
    assert layers_for(host_image, None, notebooks=True) == ()
    venv = layer / VENV.lstrip("/")
    assert (venv / "bin" / "jupyterhub-singleuser").is_file()
    site = next((venv / "lib").glob("python3.*/site-packages"))
    installed = {_normal(p.name.removesuffix(".dist-info").rsplit("-", 1)[0]) for p in site.glob("*.dist-info")}
    pins = (wheelhouse / "notebooks" / "requirements.txt").read_text().split()
    assert installed == {_normal(line.split("==")[0]) for line in pins if "==" in line}  # the deps are below
    assert "calque" not in installed and not (venv / "pyvenv.cfg").exists()  # the venv itself is the deps'
    role_vars = (REPO / "collections/ansible_collections/calque/gpu/roles/runtime/vars/main.yml").read_text()
    marker = next(v for v in role_vars.splitlines() if v.startswith("_calque_runtime_notebooks_marker:"))
    marker_path = marker.split(":", 1)[1].strip().strip('"').replace("{{ calque_runtime_venv }}", VENV)
    assert marker_path.startswith(f"{VENV}/") and not (layer / marker_path.lstrip("/")).exists()
    assert not (layer / "tmp" / "calque-runtime-deps").exists()  # the staged wheels are not kept
