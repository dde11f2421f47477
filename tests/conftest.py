"""The offline test tier: a real moto server on 127.0.0.1 for the whole run, clean state per test.

Every test sees ``AWS_ENDPOINT_URL`` pointing at that server, dummy credentials and
``CALQUE_OFFLINE=1``, so the client factory refuses anything that is not loopback.
"""

from __future__ import annotations

import os
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import timings

REPO = Path(__file__).resolve().parent.parent
OFFLINE_ENV = {
    "CALQUE_OFFLINE": "1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
# Set at import so that nothing collected later can pick up real credentials or a real endpoint.
for _k in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
    os.environ.pop(_k, None)
os.environ.update(OFFLINE_ENV)
os.environ["AWS_CONFIG_FILE"] = os.devnull
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
timings.enable_in_environment()  # the time report's spans, from every process a test starts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A real moto server on a free loopback port, shared by the run."""
    from moto.server import ThreadedMotoServer
    from support import fake_instance_refresh, fake_lifecycle_action, fake_scaling_activities

    fake_instance_refresh.install()  # moto 5.2 has no instance refresh: a strict fake, named as one
    fake_lifecycle_action.install()  # nor lifecycle actions (warm instances waiting on a hook)
    fake_scaling_activities.install()  # nor an activity history
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    os.environ["AWS_ENDPOINT_URL"] = url
    try:
        yield url
    finally:
        server.stop()
        os.environ.pop("AWS_ENDPOINT_URL", None)


@pytest.fixture
def moto(moto_endpoint: str) -> Iterator[str]:
    """The moto endpoint with clean state for this test."""
    req = urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")
    # A reset of a big state on a loaded 2-core machine has taken over 10 s (twice in full runs).
    urllib.request.urlopen(req, timeout=60).read()
    from support import fake_instance_refresh, fake_lifecycle_action, fake_scaling_activities

    fake_instance_refresh.reset()
    fake_lifecycle_action.reset()
    fake_scaling_activities.reset()
    os.environ["AWS_ENDPOINT_URL"] = moto_endpoint
    yield moto_endpoint


# --- Side by side (scripts/test runs pytest -n N) --------------------------------------------------
# The booted-host tier's e2e modules share one booted estate (tests/hosts/estate.py, session-scoped),
# so they run as one unit on one worker, in this order (each leaves the hosts as the next expects), and
# first: it is the longest chain, and it spends much of its time waiting on ssh and systemd while the
# other workers take every other test one at a time, wherever a worker is free. The molecule scenarios
# start in the background with the estate; their tests only collect the results, last. Every other
# booted module (its own fleet, module-scoped) is a unit of its own, started next on another worker.
HOSTS_TIER = "tests/hosts/"
SITE_TIER = (
    "tests/hosts/test_site_e2e.py",
    "tests/hosts/test_layout_drain_e2e.py",
    "tests/hosts/test_frontdoor_e2e.py",
    "tests/hosts/test_molecule.py",
)
# Modules whose tests read one playbook run between them (a module-scoped result): one unit each, so the
# run is made once, by whichever worker takes the module.
SHARED_RUN_MODULES = ("tests/ansible/test_pool_playbook.py",)
# The longest single tests, started right after the booted modules so that none of them is the run's tail
# (each is minutes of wall, most of it waiting on a browser, a session's expiry or ten pool.yml runs): in the
# time report of a fresh clone, the browser test started 22 minutes in and the run ended 5 minutes later.
LONG_FIRST = (
    "tests/session/test_notebook_browser.py",
    "tests/ansible/test_pool_check_predicts.py",
    "tests/ansible/test_pool_teardown.py",
    "tests/pool/test_claim_crashes.py",
)


def _unit(nodeid: str) -> str:
    """What one worker runs together: the site tier, a booted module, a module sharing a run, or a single test."""
    if nodeid.startswith(SITE_TIER):
        return HOSTS_TIER
    if nodeid.startswith((HOSTS_TIER, *SHARED_RUN_MODULES)):
        return nodeid.split("::", 1)[0]
    return nodeid


def _rank(nodeid: str) -> tuple[int, int]:
    """The site tier first, in SITE_TIER's order; then the other booted modules; then LONG_FIRST; then the rest."""
    for i, module in enumerate(SITE_TIER):
        if nodeid.startswith(module):
            return (0, i)
    if nodeid.startswith(HOSTS_TIER):
        return (1, 0)
    return (1, 1) if nodeid.startswith(LONG_FIRST) else (2, 0)


def pytest_configure(config: pytest.Config) -> None:
    """The time report: every process sums its fixtures' set-up; the controller prints the report."""
    from support.time_report import FixtureClock, TimeReport

    config.pluginmanager.register(FixtureClock(), "calque-fixture-clock")
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        config.pluginmanager.register(TimeReport(_unit), "calque-time-report")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: each module keeps its own order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """A unit of work is the site tier, a booted module, a module sharing a run (SHARED_RUN_MODULES), or else
        a single test (a module-scoped fixture is then set up once per worker that runs one of its tests:
        tests/unit/test_packaging.py's)."""

        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return TierScheduling(config, log)
