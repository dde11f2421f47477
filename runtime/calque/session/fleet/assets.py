"""Files the calque.gpu.session_service role installs: the systemd unit and an example configuration (package data)."""

from __future__ import annotations

from importlib.resources import files
from typing import Any

UNIT_NAME = "calque-session.service"
BROKER_UNIT_NAME = "calque-broker.service"


def systemd_unit() -> Any:
    """A Traversable (``.read_text()``) for calque-session.service."""
    return files("calque.session").joinpath("systemd").joinpath(UNIT_NAME)


def example_config() -> Any:
    """A Traversable for the example /etc/calque/session.yaml."""
    return files("calque.session").joinpath("systemd").joinpath("session.example.yaml")


def broker_unit() -> Any:
    """A Traversable for calque-broker.service (the front-door host's broker)."""
    return files("calque.session").joinpath("systemd").joinpath(BROKER_UNIT_NAME)
