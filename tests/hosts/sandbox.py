"""The sandbox's institution part (``scripts/sandbox`` runs ``python -m tests.hosts.sandbox``): one
booted session host of RTX PRO 6000 shape, ``playbooks/site.yml`` with the institution's teaching
group_vars, a created user checks a slice out over ssh, ``calque session list``, teardown.

Where this machine cannot boot hosts (not root; systemd-nspawn, debootstrap, ip or ssh missing; the
Debian image cannot be built, e.g. no network to the mirror; a host does not boot) it says so and why,
and shows a local simulated host instead (``local_host.py``: the same layout and session settings,
the daemon as the sandbox's user, a slice checked out and in). A failure after the host booted
(site.yml, the checkout), or of the local host, is a failure (exit 3).
"""

from __future__ import annotations

import sys
import time

from . import local_host
from .fleet import Fleet, HostSpec
from .image import ImageError, ensure_image
from .institution import SITE, institution_inventory, prepare_dlami
from .machine import HostError
from .netns import NetworkError
from .paths import REPO
from .preflight import unavailable_reason
from .wheelhouse import ensure_wheelhouse

HOST, USER = "teach0", "student"
WHAT = "site.yml on a booted session host, a slice checked out by a created user, calque session list"


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def indent(text: str) -> None:
    for line in text.rstrip().splitlines():
        print(f"  {line}", flush=True)


def instead(why: str) -> int:
    """No booted host here: say what did not run and why, then show the local simulated host."""
    say(f"institution: no booted host ({WHAT} did not run)")
    indent(f"Why: {why}")
    indent("A booted host needs root, systemd-nspawn (systemd-container), debootstrap with network to a")
    indent("Debian mirror the first time, iproute2 and openssh-client.")
    return local_host.run(why, local_host.state_dir())


def main() -> int:
    reason = unavailable_reason()
    if reason:
        return instead(f"this machine cannot boot test hosts: {reason}")
    t0 = time.monotonic()
    fleet = Fleet("sandbox")
    try:
        say("institution: the calque wheelhouse the hosts install from (no package index on a host)")
        wheelhouse = ensure_wheelhouse()
        indent(str(wheelhouse))
        say(f"institution: booting session host {HOST} (Debian bookworm, systemd-nspawn; 1x RTX PRO 6000, simulated)")
        try:
            ensure_image()
            fleet.up([HostSpec(HOST, "rtx-pro-6000", ("teaching",))])
        except (ImageError, HostError, NetworkError) as e:
            fleet.down()
            return instead(f"no host could be booted here: {e}")
        indent(f"{HOST} at {fleet.host(HOST).address}, reached by ssh from namespace {fleet.controller_ns}")
        prepare_dlami(fleet)
        inventory, extra = institution_inventory(fleet, wheelhouse)
        say(f"institution: ansible-playbook -i {inventory.relative_to(REPO)} playbooks/site.yml (teaching group_vars)")
        r = fleet.playbook(SITE, "-e", f"@{extra}", inventory=inventory)
        if r.returncode != 0:
            print(r.stdout[-4000:] + r.stderr[-2000:])
            say("institution: site.yml failed")
            return 3
        indent("\n".join(line for line in r.stdout.splitlines() if line.startswith(HOST) and "ok=" in line))
        say(f"institution: {USER} (a created user) checks a slice out over ssh: calque session checkout --ttl 30m")
        fleet.ssh(HOST, f"id {USER} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash {USER}")
        fleet.authorize(HOST, USER)
        indent(fleet.ssh(HOST, "calque session checkout --profile 1g.24gb --ttl 30m", user=USER).stdout)
        say(f"institution: calque session list (as {USER})")
        indent(fleet.ssh(HOST, "calque session list", user=USER).stdout)
    finally:
        say("institution: teardown (host powered off, namespaces and files removed)")
        fleet.down()
    say(f"institution: done in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
