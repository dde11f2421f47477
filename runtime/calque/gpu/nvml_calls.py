"""The NVML adapter: the one place ``pynvml`` is loaded and its errors become ``calque.gpu.nvml_errors``.

``pynvml`` (nvidia-ml-py) is imported when the adapter is opened, so tests put a strict fake module
in its place and the same code runs. The discovery reads (``nvml_reads.py``), the control calls
(``nvml.py``) and the utilisation sampler (``nvml_sampling.py``) all call the driver through here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from calque.gpu import nvml_errors as nv

T = TypeVar("T")


class NvmlCalls:
    """An open NVML library, its calls with calque's error mapping, and the device handles."""

    def __init__(self, lib: Any | None = None) -> None:
        try:
            self._nv = lib if lib is not None else importlib.import_module("pynvml")
        except ImportError as exc:
            raise nv.NoGpuDriver(nv.LIBRARY_NOT_FOUND, "the nvidia-ml-py package (pynvml) is not installed") from exc
        self.call("initialise (is the NVIDIA driver installed and loaded?)", self._nv.nvmlInit)

    def close(self) -> None:
        self.call("shut NVML down", self._nv.nvmlShutdown)

    @property
    def lib(self) -> Any:
        """The pynvml module (or the tests' fake) every call goes to."""
        return self._nv

    def call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``; an NVML error becomes a calque GPU error saying it could not ``what``."""
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            code = int(getattr(exc, "value", nv.UNKNOWN))
            try:
                text = str(exc)
            except Exception:  # pynvml's __str__ asks the library, which may be what failed
                text = nv.CODE_NAMES.get(code, f"NVML error {code}")
            raise nv.driver_error(code, f"NVML: could not {what}: {text}") from exc

    def maybe(self, what: str, fn: Callable[..., T], *args: Any, absent: tuple[int, ...]) -> T | None:
        """A call whose listed error codes mean 'not there' rather than failure."""
        try:
            return self.call(what, fn, *args)
        except nv.GpuDriverError as exc:
            if exc.code in absent:
                return None
            raise

    def const(self, prefix: str, suffix: str) -> int:
        """One of the library's constants, by its name in two parts (``NVML_COMPUTEMODE_`` + mode)."""
        return int(getattr(self._nv, prefix + suffix))

    def handle(self, index: int) -> Any:
        return self.call(f"open GPU {index}", self._nv.nvmlDeviceGetHandleByIndex, index)

    def count(self) -> int:
        return int(self.call("count GPUs", self._nv.nvmlDeviceGetCount))

    def mig_mode(self, index: int) -> tuple[bool, bool]:
        """(current, pending); (False, False) on a card without MIG."""
        h = self.handle(index)
        got = self.maybe(f"read GPU {index}'s MIG mode", self._nv.nvmlDeviceGetMigMode, h, absent=(nv.NOT_SUPPORTED,))
        return (False, False) if got is None else (bool(got[0]), bool(got[1]))

    def mig_handles(self, index: int, h: Any) -> list[Any]:
        """The handles of GPU ``index``'s MIG devices (``h`` its own handle)."""
        n = int(self.call(f"count GPU {index}'s MIG devices", self._nv.nvmlDeviceGetMaxMigDeviceCount, h))
        out = []
        for i in range(n):
            m = self.maybe(
                f"open GPU {index}'s MIG device {i}",
                self._nv.nvmlDeviceGetMigDeviceHandleByIndex,
                h,
                i,
                absent=(nv.NOT_FOUND, nv.INVALID_ARGUMENT),
            )
            if m is not None:
                out.append(m)
        return out
