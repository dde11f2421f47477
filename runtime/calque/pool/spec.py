"""Reading a PoolSpec file (YAML or JSON, ``-`` for stdin); a relative workload path is relative to the file.

``/etc/calque/pool.yaml`` is read under its old name ``pool.yml`` for one release, with a warning
(``calque.confignames``).

A workload given as ``s3://bucket/key.py[::Class]`` is kept as it is: the worker downloads it at start
(``calque.pool.bootstrap.materialize_workload``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from calque.configfile import read_mapping, validate
from calque.confignames import config_path
from calque.models import PoolSpec


def load_spec(path: str | Path, **overrides: Any) -> PoolSpec:
    if str(path) != "-":
        path = config_path(Path(path), "pool spec")
    doc = read_mapping(path, "pool spec")
    doc.update({k: v for k, v in overrides.items() if v is not None})
    workload = str(doc.get("workload", ""))
    script, sep, target = workload.partition("::")
    if script and not script.startswith("s3://") and not Path(script).is_absolute():
        doc["workload"] = str((Path(path).parent / script).resolve()) + sep + target
    return validate(PoolSpec, doc, path, "pool spec")
