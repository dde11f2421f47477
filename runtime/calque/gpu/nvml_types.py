"""Plain data as NVML reports it, shared by the NVML backend and ``calque gpu verify``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DriverProfile:
    """A GPU-instance profile as the driver reports it (``nvidia-smi mig -lgip -lgipp``)."""

    profile_id: int
    constant: str
    name: str
    compute_slices: int
    max_count: int
    sms: int
    memory_mib: int
    starts: list[int] = field(default_factory=list)
    size: int = 0


def text_of(v: Any) -> str:
    """A string NVML returned (bytes from older pynvml releases, str from newer)."""
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)
