"""The sandbox's institution part (``scripts/sandbox`` runs ``python -m tests.hosts.sandbox``): one
booted session host of RTX PRO 6000 shape and a front-door host, ``playbooks/site.yml`` with the
institution inventory (its teaching group_vars, its institution at the run's addresses: munge with
one key, the broker on the front door), a created user (the same uid on both) checks a slice out
over ssh with ``--anywhere`` (through the broker over TCP), ``calque session list --all``, a
check-in by ``SESSION@HOST``, teardown.

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
from .institution import SITE, institution_inventory, prepare_dlami, run_institution
from .machine import HostError
from .netns import NetworkError
from .paths import REPO
from .preflight import unavailable_reason
from .wheelhouse import ensure_wheelhouse

HOST, FRONT, USER, UID = "teach0", "front0", "student", 3201
WHAT = (
    "site.yml on a booted session host and a front door, a slice checked out --anywhere by a created user, "
    "calque session list --all"
)


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
        say(
            f"institution: booting session host {HOST} (Debian bookworm, systemd-nspawn; 1x RTX PRO 6000, "
            f"simulated) and front door {FRONT} (no GPU)"
        )
        try:
            ensure_image()
            fleet.up(
                [HostSpec(HOST, "rtx-pro-6000", ("teaching",)), HostSpec(FRONT, "none", ("calque_session_frontdoor",))]
            )
        except (ImageError, HostError, NetworkError) as e:
            fleet.down()
            return instead(f"no host could be booted here: {e}")
        for name in (HOST, FRONT):
            indent(f"{name} at {fleet.host(name).address}, reached by ssh from namespace {fleet.controller_ns}")
        prepare_dlami(fleet, hosts=[HOST])
        inventory, extra = institution_inventory(fleet, wheelhouse, institution=run_institution(fleet, FRONT))
        where = inventory.relative_to(REPO)
        say(f"institution: ansible-playbook -i {where} playbooks/site.yml (the institution inventory)")
        r = fleet.playbook(SITE, "-e", f"@{extra}", inventory=inventory)
        if r.returncode != 0:
            print(r.stdout[-4000:] + r.stderr[-2000:])
            say("institution: site.yml failed")
            return 3
        indent("\n".join(line for line in r.stdout.splitlines() if line.startswith((HOST, FRONT)) and "ok=" in line))
        for name in (HOST, FRONT):  # users map by name: the same uid on every host
            fleet.ssh(name, f"id {USER} >/dev/null 2>&1 || useradd --uid {UID} --create-home --shell /bin/bash {USER}")
        fleet.authorize(HOST, USER)
        say(
            f"institution: {USER} on {HOST} asks the front door for a slice anywhere "
            "(calque session checkout --anywhere: TCP to the broker with munge, the broker to the host likewise)"
        )
        got = fleet.ssh(HOST, "calque session checkout --anywhere --profile 1g.24gb --ttl 30m", user=USER)
        indent(got.stdout + got.stderr)
        say(f"institution: calque session list --all (as {USER}: every host, as the broker sees them)")
        indent(fleet.ssh(HOST, "calque session list --all", user=USER).stdout)
        ref = got.stdout.split()[1].rstrip(":")  # "session SESSION@HOST: ..."
        say(f"institution: calque session checkin {ref} (the broker makes the call on that host as {USER})")
        indent(fleet.ssh(HOST, f"calque session checkin {ref}", user=USER).stdout)
    finally:
        say("institution: teardown (host powered off, namespaces and files removed)")
        fleet.down()
    say(f"institution: done in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
