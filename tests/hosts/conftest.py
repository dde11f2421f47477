"""Fixtures of the booted-host tier: the cached image, the wheelhouse, and runs of hosts that are
always torn down.

Tests marked ``hosts`` are skipped, with the reason, only where this machine cannot boot hosts
(not root, or systemd-nspawn/debootstrap/iproute2/ssh missing); ``scripts/test`` installs those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .fleet import Fleet, HostSpec
from .image import ensure_image
from .preflight import unavailable_reason
from .wheelhouse import ensure_wheelhouse


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hosts: boots Debian test hosts with systemd-nspawn (root; tests/hosts)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"test hosts cannot run here: {reason}")
    for item in items:
        if item.get_closest_marker("hosts"):
            item.add_marker(skip)


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
