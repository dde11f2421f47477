"""The names of calque's own configuration files: ``.yaml``, as ``host.yaml``, ``session.yaml``,
``institution.yaml`` and ``broker.yaml`` always were.

Two names calque chooses were ``.yml`` until 0.1: the pool spec on a worker host (``/etc/calque/pool.yml``,
written by the worker's user-data and the ``calque.gpu.pool_worker`` role) and ``calque run``'s mapping
file beside the script (``calque-run.yml``). They are now ``pool.yaml`` and ``calque-run.yaml``. For one
release the old name is still read, with a warning that says to rename it:

- only the old file there: it is read, with the warning;
- both there: the new one is read and the old one named as ignored (the warning says to remove it);
- ``/etc/calque/pool.yml`` asked for by name (a unit written before the rename): read, with the warning.

A file whose name the user chose (``--spec lab-a-pool-spec.yml``, ``--pools my-pools.yml``) is read as
named, whatever its suffix. Ansible's files (playbooks, inventories, roles) keep ``.yml``, Ansible's
convention; they are not calque's configuration files.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

POOL_SPEC_ON_HOST = Path("/etc/calque/pool.yaml")
# calque's name for each of its files -> the name it had until 0.1
OLD_NAMES = {"pool.yaml": "pool.yml", "calque-run.yaml": "calque-run.yml"}
LAST_RELEASE_READING_OLD_NAMES = "0.2"
_OLD_DEFAULTS = {POOL_SPEC_ON_HOST.with_name(OLD_NAMES[POOL_SPEC_ON_HOST.name])}


def config_path(path: Path, what: str) -> Path:
    """The file to read for ``path``: itself, or the same file under its name of before the rename
    (see the module's note); ``path`` itself where neither exists, so that its reader says so."""
    if path in _OLD_DEFAULTS:
        _warn(what, path, f"calque's name for it is now {path.with_suffix('.yaml')}: rename it")
        return path
    old_name = OLD_NAMES.get(path.name)
    if old_name is None:
        return path
    old = path.with_name(old_name)
    if not old.is_file():
        return path
    if path.exists():
        _warn(what, old, f"ignored: {path} is read instead; remove {old}")
        return path
    _warn(what, old, f"read under its old name: rename it {path.name}")
    return old


def _warn(what: str, path: Path, action: str) -> None:
    log.warning(
        "%s %s: %s (calque %s is the last release that reads the .yml name)",
        what,
        path,
        action,
        LAST_RELEASE_READING_OLD_NAMES,
    )
