"""Reading a PoolSpec file (YAML or JSON, ``-`` for stdin); a relative workload path is relative to the file.

A workload given as ``s3://bucket/key.py[::Class]`` is kept as it is: the worker downloads it at start
(``calque.pool.bootstrap.materialize_workload``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from calque.errors import UsageError
from calque.models import PoolSpec


def load_spec(path: str | Path, **overrides: Any) -> PoolSpec:
    p = Path(path)
    try:
        doc = yaml.safe_load(sys.stdin.read() if str(path) == "-" else p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read pool spec {p}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"pool spec {p} is not valid YAML/JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise UsageError(f"pool spec {p} must be a mapping of PoolSpec fields")
    doc.update({k: v for k, v in overrides.items() if v is not None})
    workload = str(doc.get("workload", ""))
    script, sep, target = workload.partition("::")
    if script and not script.startswith("s3://") and not Path(script).is_absolute():
        doc["workload"] = str((p.parent / script).resolve()) + sep + target
    try:
        return PoolSpec.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "(document)"
        raise UsageError(f"pool spec {p}: {where}: {first.get('msg')}") from exc
