"""One booted institution for the e2e modules: five hosts dressed as the institution's, converged once.

The site e2e, the layout-drain e2e and the front-door e2e each booted and converged hosts of their own
(3 + 1 + 4 hosts, about ten minutes each on a loaded 2-core machine). They share this estate instead:
two teaching RTX PRO 6000 MIG hosts, a teaching 8x H100 MIG host, a research L40S MPS host and a
front-door host, with munge, ``institution.yaml``, the broker and JupyterHub (``calque_notebooks`` on
the front door and on teach-a, whose venv gets JupyterLab); the same four users (fixed uids, in their
labs' groups) and the hub's service user on every host. Whichever test first asks for ``estate``
converges it (site.yml once); the site e2e's first test runs it again (a second run changes
nothing, front door and hub included).
The modules run in one worker, in this order: site e2e, layout drain, front door (tests/conftest.py);
each leaves the hosts as it found them, except where the next does not look (the H100's GPU 0 layout).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.timings import span

from .fleet import Fleet, HostSpec
from .institution import SITE, institution_inventory, one_gpu_mps_slots, prepare_dlami, run_institution
from .paths import HOSTS_DIR
from .scenarios import SCENARIO_TEST

TEACH_A, TEACH_B, H100, RESEARCH, FRONT = "teach-a", "teach-b", "teach-h100", "research", "front"
ALL = (TEACH_A, TEACH_B, H100, RESEARCH, FRONT)
GPU_HOSTS = (TEACH_A, TEACH_B, H100, RESEARCH)
NOTEBOOK_HOSTS = (FRONT, TEACH_A)  # calque_notebooks: the hub on the front door, JupyterLab on teach-a
# Notebook hosts boot with the notebooks extra's layer too (runtime_layer.py); teach-b must not have it.
SPECS = [
    HostSpec(TEACH_A, "rtx-pro-6000", ("teaching",), notebooks=TEACH_A in NOTEBOOK_HOSTS),
    HostSpec(TEACH_B, "rtx-pro-6000", ("teaching",)),
    HostSpec(H100, "p5.48xlarge", ("teaching",)),
    HostSpec(RESEARCH, "l40s", ("research",)),
    HostSpec(FRONT, "none", ("calque_session_frontdoor",), notebooks=FRONT in NOTEBOOK_HOSTS),
]
# What each session host offers through the broker (the H100's smallest slice is a 1g.10gb).
OFFERS = {TEACH_A: ["1g.24gb"], TEACH_B: ["1g.24gb"], H100: ["1g.10gb"], RESEARCH: ["mps"]}
USERS = {"alice": 3101, "bob": 3102, "carol": 3103, "dave": 3104}
# The institution inventory's two labs (share 1 each), as Unix groups with one gid on every host.
LABS = {"alice": "lab-a", "bob": "lab-a", "carol": "lab-b", "dave": "lab-b"}
LAB_GIDS = {"lab-a": 3201, "lab-b": 3202}
# The hub's service user (institution.yaml's hub.service_user): one uid on every host, as the directory's.
HUB_USER, HUB_UID = "jupyterhub", 3150
LOGIN_HOSTS = (TEACH_A, H100)  # where the tests log users in by ssh
# The front door's aging bound (seconds): the fair-share order holds until a request is this old. The
# front-door e2e checks that order with a dozen commands inside it: room for them on a loaded machine.
AGING = 180
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
LOGS = HOSTS_DIR / "logs"


def recap(out: str) -> dict[str, dict[str, int]]:
    return {
        m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])}
        for m in RECAP.finditer(out)
    }


class Estate:
    """The booted hosts, the inventory folder (institution group_vars + the run's hosts) and helpers."""

    def __init__(self, fleet: Fleet, inventory: Path, extra: Path) -> None:
        self.fleet, self.inventory, self.extra = fleet, inventory, extra
        self.first: subprocess.CompletedProcess[str] | None = None  # site.yml's first run on these hosts
        self.released = False

    def site(self, log: str, *args: str) -> subprocess.CompletedProcess[str]:
        """site.yml with the institution inventory; its output is also kept in build/hosts/logs/e2e-LOG.log."""
        path = LOGS / f"e2e-{log}.log"
        with path.open("w") as out, span("estate", f"site.yml, the {log} run"):
            r = self.fleet.playbook(
                SITE, "-e", f"@{self.extra}", *args, inventory=self.inventory, stdout=out, stderr=subprocess.STDOUT
            )
        r.stdout = path.read_text()
        return r

    def as_user(
        self, user: str, command: str, check: bool = True, host: str = TEACH_A
    ) -> subprocess.CompletedProcess[str]:
        return self.fleet.ssh(host, command, user=user, check=check)

    def nodes(self, slice_id: str, host: str = TEACH_A) -> list[str]:
        """The capability nodes of a MIG slice, as the session service's backend lists them on ``host``."""
        code = (
            "import json, sys\nfrom calque.gpu.hostconfig import open_backend\nb = open_backend()\n"
            "m = next(m for m in b.mig_devices() if m.uuid == sys.argv[1])\nprint(json.dumps(b.capability_devices(m)))"
        )
        r = self.fleet.ssh(host, f"/opt/calque/venv/bin/python -c '{code}' {slice_id}")
        return list(json.loads(r.stdout))

    def can_read(self, user: str, path: str, host: str = TEACH_A) -> bool:
        return self.as_user(user, f"test -r {path}", check=False, host=host).returncode == 0

    def release(self) -> None:
        """Tear the hosts down (once): after the last test that uses them, or at the session's end."""
        if not self.released:
            self.released = True
            with span("estate", "tear down"):
                self.fleet.down()

    def converge(self) -> None:
        """site.yml once (kept in ``first``); a failed first run fails every test that needs it, unrepeated."""
        if self.first is None:
            self.first = self.site("first")
        assert self.first.returncode == 0, self.first.stdout[-6000:]


LIVE: list[Estate] = []  # the session's estate, for release_after()


def release_after(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of a run of tests that use the estate, its hosts go (five idle booted hosts
    would tick beside the rest of the worker's tests otherwise)."""
    if "estate" in getattr(item, "fixturenames", ()) and (
        nextitem is None or "estate" not in getattr(nextitem, "fixturenames", ())
    ):
        for e in LIVE:
            e.release()


def _add_users(f: Fleet) -> None:
    """The four users with one uid on every host, in their lab's group; they log in by ssh where tests do."""
    for user, uid in USERS.items():
        lab = LABS[user]
        make = (
            f"(getent group {lab} >/dev/null || groupadd --gid {LAB_GIDS[lab]} {lab}) && "
            f"(id {user} >/dev/null 2>&1 || useradd --uid {uid} -G {lab} --create-home --shell /bin/bash {user})"
        )
        for host in ALL:
            f.ssh(host, make)
        for host in LOGIN_HOSTS:
            f.authorize(host, user)
    hub = (
        f"id {HUB_USER} >/dev/null 2>&1 || "
        f"useradd --system --uid {HUB_UID} --no-create-home --shell /usr/sbin/nologin {HUB_USER}"
    )
    for host in ALL:
        f.ssh(host, hub)


@pytest.fixture(scope="session")
def booted_estate(host_image: Path, wheelhouse: Path, request: pytest.FixtureRequest) -> Iterator[Estate]:
    # The session's molecule scenarios (if any are selected) start now and run beside the e2e modules.
    if any(item.name.startswith(SCENARIO_TEST) for item in request.session.items):
        request.getfixturevalue("molecule_runs")
    fleet = Fleet("e2e")
    made: Estate | None = None
    teaching_limits: dict[str, object] = {"calque_session_service_default_limits": {"max_sessions": 4, "max_ttl": "4h"}}
    try:
        with span("estate", f"boot {len(SPECS)} hosts"):
            # the runtime's pinned dependencies in the image, as a golden image's: the runtime scenario
            # is the install from nothing; site.yml here still installs and records the calque wheel
            fleet.up(SPECS, runtime_deps=wheelhouse)
        with span("estate", "the stand-in driver, as a Deep Learning AMI's"):
            prepare_dlami(fleet, hosts=list(GPU_HOSTS))
        with span("estate", "users and labs"):
            _add_users(fleet)
        institution = {**run_institution(fleet, FRONT, offers=OFFERS), "hub": {"service_user": HUB_USER}}
        notebooks: dict[str, object] = {"calque_notebooks": True}
        inventory, extra = institution_inventory(
            fleet,
            wheelhouse,
            institution=institution,
            host_vars={
                TEACH_A: {**teaching_limits, **notebooks},
                TEACH_B: teaching_limits,
                H100: {"calque_nvidia_driver_instance_type": "p5.48xlarge"},
                RESEARCH: {"calque_session_service_mps": one_gpu_mps_slots()},
                FRONT: {
                    **notebooks,
                    "calque_session_frontdoor_queue": {
                        "max_queued_per_user": 20,
                        "claim_window": "30s",  # a grant nobody claims goes back within the test's patience
                        "aging": f"{AGING}s",
                    },
                    # The estate's hosts share a loaded 2-core machine, where a live host's answer can take
                    # seconds: only a host silent this long is marked not answering and skipped (the
                    # default, 1 s, is for real hosts; tests/session's hung-host test holds the rule).
                    "calque_session_frontdoor_settings": {"host_answer_within": "10s"},
                },
            },
        )
        LOGS.mkdir(parents=True, exist_ok=True)
        made = Estate(fleet, inventory, extra)
        LIVE.append(made)
        yield made
    finally:
        if made is None:
            fleet.down()
        else:
            made.release()


@pytest.fixture
def estate(booted_estate: Estate) -> Estate:
    """The estate after site.yml: the first test that asks converges it, once for the session."""
    assert not booted_estate.released, "the estate's hosts are gone: its tests run together (tests/conftest.py)"
    booted_estate.converge()
    return booted_estate
