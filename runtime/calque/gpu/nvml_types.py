"""Plain data as NVML reports it, shared by the NVML backend and ``calque gpu verify``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


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


class NvmlDevices(Protocol):
    """What the sampler (``nvml_sampling.py``) asks of the NVML backend: the library, its calls with
    calque's error mapping, and the devices. The backend (``nvml.py``) implements it; the sampler
    needs nothing else of it, so neither module imports the other's."""

    @property
    def lib(self) -> Any: ...

    def call(self, what: str, fn: Callable[..., T], *args: Any) -> T: ...

    def maybe(self, what: str, fn: Callable[..., T], *args: Any, absent: tuple[int, ...]) -> T | None: ...

    def handle(self, index: int) -> Any: ...

    def mig_handles(self, index: int, h: Any) -> list[Any]: ...

    def count(self) -> int: ...

    def mig_mode(self, index: int) -> tuple[bool, bool]: ...
