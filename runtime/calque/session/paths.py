"""Where the session service lives by default, in a module light enough for the CLI's start-up path."""

from __future__ import annotations

from pathlib import Path

DEFAULT_CONFIG = Path("/etc/calque/session.yaml")
DEFAULT_SOCKET = Path("/run/calque/session.sock")
