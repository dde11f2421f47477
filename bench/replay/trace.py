"""Reading the Alibaba GPU trace (cluster-trace-gpu-v2023, ``openb_pod_list_default.csv``) by path.

The trace is for research or study use only: it is never copied into this repository; the bench reads
it where it lies and says where to get it when it is not there.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

WHERE = (
    "the trace is not shipped with calque (research or study use only). Get "
    "cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv from https://github.com/alibaba/clusterdata "
    "(commit 7a6c496e4f4b6ce6150be8f881cb051bf2abff42) and pass it with --trace PATH"
)
COLUMNS = ("name", "num_gpu", "gpu_milli", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")


class TraceError(Exception):
    """The trace is missing or not the file we expect: the message says what to do."""


@dataclass(frozen=True)
class Task:
    name: str
    num_gpu: int
    gpu_milli: int  # the share of one GPU asked for when num_gpu is 1 (1000 = a whole GPU)
    qos: str  # LS, BE or Burstable
    phase: str
    created: float  # seconds from the trace's start
    scheduled: float | None  # None: never scheduled (Pending)
    deleted: float | None


def _num(row: dict[str, str], col: str) -> float | None:
    raw = (row.get(col) or "").strip()
    return float(raw) if raw else None


def read_tasks(path: Path) -> list[Task]:
    if not path.is_file():
        raise TraceError(f"no trace at {path}: {WHERE}")
    tasks = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(
                f"{path} lacks the columns {', '.join(missing)}: is it openb_pod_list_default.csv? {WHERE}"
            )
        for n, row in enumerate(reader, start=2):
            try:
                created = _num(row, "creation_time")
                if created is None:
                    raise ValueError("no creation_time")
                scheduled = _num(row, "scheduled_time")
                tasks.append(
                    Task(
                        name=row["name"],
                        num_gpu=int(row["num_gpu"] or 0),
                        gpu_milli=int(row["gpu_milli"] or 0),
                        qos=row["qos"],
                        phase=row["pod_phase"],
                        created=created,
                        scheduled=scheduled if row["pod_phase"] != "Pending" else None,
                        deleted=_num(row, "deletion_time"),
                    )
                )
            except (ValueError, KeyError) as exc:
                raise TraceError(f"{path} line {n}: {exc}") from exc
    return tasks
