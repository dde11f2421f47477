"""The broker's audit trail: JSONL, one line per refused request from another host (a forged,
expired or replayed credential, a body changed after signing, one made for another host, one naming
another user), per queued request it dropped (its client gone) or expired (its host silent), and per
session it checked in that a host made for a request that had ended; each written with one
``write`` (O_APPEND) and fsync'd before the refusal is answered: refusals are rare, and the trail is
what an admin reads after an attack (or when a researcher asks where a request went)."""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from calque.session.files import open_private, private_directory


class BrokerAudit:
    def __init__(self, path: Path) -> None:
        private_directory(path.parent, "broker audit directory", mode=0o750)
        self.path = path
        self._lock = threading.Lock()
        self._fd = open_private(path, os.O_WRONLY | os.O_APPEND, "broker audit log", tighten=False)

    def event(self, event: str, **fields: Any) -> None:
        entry = {"ts": datetime.now(timezone.utc).isoformat(), "event": event, **fields}
        line = (json.dumps(entry, sort_keys=True, default=str) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)
