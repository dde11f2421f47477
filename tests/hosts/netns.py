"""Network namespaces for one run: a "controller" namespace with a bridge, one namespace per host.

Addresses come from 198.18.0.0/15, the range RFC 2544 reserves for benchmarking network devices: it
is routed nowhere, is not one of the private ranges a real site or this machine's own network may
use, and it only ever exists inside namespaces this run made (never in the machine's root
namespace), so nothing a test sends can leave the run. Every run uses the same /24 because each run
has its own controller namespace: two runs never see each other's addresses.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from pathlib import Path

from . import procs
from .paths import HANG_S

TEST_RANGE = ipaddress.ip_network("198.18.0.0/15")
SUBNET = ipaddress.ip_network("198.18.0.0/24")
CONTROLLER_ADDRESS = ipaddress.ip_address("198.18.0.1")
FIRST_HOST = 10
BRIDGE = "br0"
NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    """An ``ip`` command failed; the message names the command and its error."""


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=HANG_S)  # a hang guard
    if check and proc.returncode != 0:
        raise NetworkError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc


def host_address(index: int) -> str:
    addr = SUBNET.network_address + FIRST_HOST + index
    if addr not in SUBNET or addr == SUBNET.broadcast_address:
        raise NetworkError(f"host index {index} does not fit in {SUBNET}")
    return str(addr)


def exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def list_namespaces(prefix: str) -> list[str]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))


def create_controller(name: str) -> None:
    """The controller namespace: loopback, and a bridge that carries the controller's address."""
    ip("netns", "add", name)
    ip("link", "set", "lo", "up", netns=name)
    ip("link", "add", BRIDGE, "type", "bridge", netns=name)
    ip("addr", "add", f"{CONTROLLER_ADDRESS}/{SUBNET.prefixlen}", "dev", BRIDGE, netns=name)
    ip("link", "set", BRIDGE, "up", netns=name)


def add_host(controller: str, name: str, index: int) -> str:
    """A host's namespace wired to the controller's bridge by a veth pair; returns its address.

    The pair is created with each end directly in its namespace, so it never appears in the root one.
    """
    address = host_address(index)
    ip("netns", "add", name)
    ip("link", "set", "lo", "up", netns=name)
    port = f"h{index}"
    ip("link", "add", "name", port, "netns", controller, "type", "veth", "peer", "name", "eth0", "netns", name)
    ip("link", "set", port, "master", BRIDGE, "up", netns=controller)
    ip("addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", "eth0", netns=name)
    ip("link", "set", "eth0", "up", netns=name)
    return address


def namespace_inode(name: str) -> int | None:
    try:
        return os.stat(NETNS_DIR / name).st_ino
    except OSError:
        return None


def pids_in(name: str) -> list[int]:
    """Processes whose network namespace is ``name`` (only ones this run started can be there)."""
    ino = namespace_inode(name)
    if ino is None:
        return []
    own = os.getpid()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            if os.stat(entry / "ns/net").st_ino == ino:
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def kill_pids_in(name: str, grace: float = 5.0) -> list[int]:
    """SIGTERM, then SIGKILL after ``grace`` seconds, every process left in namespace ``name``."""
    pids = pids_in(name)
    procs.stop([(p, procs.start_time(p)) for p in pids], grace)
    return pids


def delete(name: str) -> None:
    """Remove namespace ``name`` (its veth ends go with it once no process holds it)."""
    if exists(name):
        ip("netns", "del", name, check=False)
        # `ip netns del` leaves the file when its bind mount is already gone (a crashed run).
        try:
            (NETNS_DIR / name).unlink()
        except FileNotFoundError:
            pass
        except OSError:
            subprocess.run(["umount", "-l", str(NETNS_DIR / name)], capture_output=True, check=False)
            (NETNS_DIR / name).unlink(missing_ok=True)


def root_addresses_in_test_range() -> list[str]:
    """Addresses of the root namespace inside 198.18.0.0/15 (there must be none)."""
    out = ip("-j", "addr", "show").stdout
    found = []
    for link in json.loads(out or "[]"):
        for a in link.get("addr_info", []):
            if a.get("family") == "inet" and ipaddress.ip_address(a["local"]) in TEST_RANGE:
                found.append(f"{link['ifname']}: {a['local']}")
    return found
