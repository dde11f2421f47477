"""Reading ``/etc/calque/institution.yaml`` (``calque.models.institution``): host daemons and the broker
both read it. A missing file is an institution of one host (no broker, no labs); a broken one is an
error naming the file and the field."""

from __future__ import annotations

from pathlib import Path

from calque.configfile import load_model
from calque.models.institution import Institution

DEFAULT_INSTITUTION = Path("/etc/calque/institution.yaml")


def load_institution(path: Path | None = None) -> Institution:
    path = path or DEFAULT_INSTITUTION
    if not path.exists():
        return Institution()
    return load_model(Institution, path, "institution file", empty_ok=True)
