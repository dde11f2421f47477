"""Fixtures of the booted-host tier: the cached image, the wheelhouse, and runs of hosts that are
always torn down.

Tests marked ``hosts`` are skipped, with the reason, only where this machine cannot boot hosts
(not root, or systemd-nspawn/debootstrap/iproute2/ssh missing); ``scripts/test`` installs those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .estate import booted_estate, estate, release_after  # noqa: F401 (the e2e modules' shared estate)
from .fleet import Fleet, HostSpec
from .image import ensure_image
from .paths import HOSTS_DIR
from .preflight import unavailable_reason
from .scenarios import SCENARIO_TEST, MoleculeRuns
from .wheelhouse import ensure_wheelhouse

SCENARIO_TIMEOUT = 900  # seconds; a hung scenario is killed (its process group) and torn down


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hosts: boots Debian test hosts with systemd-nspawn (root; tests/hosts)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The scenarios' tests last: their scenarios run in the background from the first test that asks
    # for molecule_runs (the e2e's hosts fixture), and these only collect the results.
    items.sort(key=lambda item: item.name.startswith(SCENARIO_TEST))  # stable: the rest keep their order
    reason = unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"test hosts cannot run here: {reason}")
    for item in items:
        if item.get_closest_marker("hosts"):
            item.add_marker(skip)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    release_after(item, nextitem)


@pytest.fixture(scope="session")
def host_image() -> Path:
    """The Debian bookworm root filesystem, debootstrapped once (cached under build/hosts/images)."""
    return ensure_image()


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """This checkout's calque wheelhouse (calque wheel, pinned dependency wheels, requirements.txt,
    SHA256SUMS), built once per content of the runtime."""
    return ensure_wheelhouse()


BootHosts = Callable[..., Fleet]


@pytest.fixture
def boot_hosts(host_image: Path) -> Iterator[BootHosts]:
    """``boot_hosts(name, [HostSpec(...), ...], wheelhouse=None)``: a booted run, torn down after the test."""
    fleets: list[Fleet] = []

    def boot(name: str, specs: list[HostSpec], wheelhouse: Path | None = None) -> Fleet:
        f = Fleet(name)
        fleets.append(f)
        return f.up(specs, wheelhouse=wheelhouse)

    yield boot
    for f in fleets:
        f.down()


@pytest.fixture(scope="session")
def molecule_runs(request: pytest.FixtureRequest, wheelhouse: Path, host_image: Path) -> Iterator[MoleculeRuns]:
    """``molecule test`` of every scenario this session selected, started in the background the first
    time a test asks (the e2e does, so the two overlap); each scenario's test waits for its own."""
    names = [
        item.callspec.params["scenario"]
        for item in request.session.items
        if item.name.startswith(SCENARIO_TEST) and hasattr(item, "callspec") and not item.get_closest_marker("skip")
    ]
    runs = MoleculeRuns(names, HOSTS_DIR / "logs", SCENARIO_TIMEOUT).start()
    yield runs
    runs.close()
