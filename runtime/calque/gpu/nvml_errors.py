"""NVML's error codes and the calque errors they become.

Both backends raise ``GpuDriverError`` subclasses carrying the NVML code, so callers (the planner,
the session service, the CLI) see the same errors from a real card and from the simulator.
"""

from __future__ import annotations

from calque.errors import InfrastructureError, RefusedError, UsageError

# Values from nvml.h / pynvml (NVML_ERROR_*).
SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
ARGUMENT_VERSION_MISMATCH = 25
INVALID_STATE = 29
UNKNOWN = 999

CODE_NAMES = {
    INVALID_ARGUMENT: "NVML_ERROR_INVALID_ARGUMENT",
    NOT_SUPPORTED: "NVML_ERROR_NOT_SUPPORTED",
    NO_PERMISSION: "NVML_ERROR_NO_PERMISSION",
    NOT_FOUND: "NVML_ERROR_NOT_FOUND",
    DRIVER_NOT_LOADED: "NVML_ERROR_DRIVER_NOT_LOADED",
    LIBRARY_NOT_FOUND: "NVML_ERROR_LIBRARY_NOT_FOUND",
    FUNCTION_NOT_FOUND: "NVML_ERROR_FUNCTION_NOT_FOUND",
    GPU_IS_LOST: "NVML_ERROR_GPU_IS_LOST",
    RESET_REQUIRED: "NVML_ERROR_RESET_REQUIRED",
    IN_USE: "NVML_ERROR_IN_USE",
    INSUFFICIENT_RESOURCES: "NVML_ERROR_INSUFFICIENT_RESOURCES",
    INVALID_STATE: "NVML_ERROR_INVALID_STATE",
    UNINITIALIZED: "NVML_ERROR_UNINITIALIZED",
}

# What a person should do about each code (appended to the message).
_ADVICE = {
    NOT_SUPPORTED: "this card or driver does not support the operation (check `calque gpu catalog`)",
    NO_PERMISSION: "run as root (MIG, compute-mode and reset changes need root)",
    IN_USE: "stop the processes using the GPU or instance first (see `calque gpu info`)",
    RESET_REQUIRED: "reset the GPU (`calque gpu mig apply --config FILE --allow-reset` completes a pending MIG "
    "mode change) or reboot the host",
    INSUFFICIENT_RESOURCES: "the layout does not fit the card: see the valid profiles with `calque gpu catalog`",
    DRIVER_NOT_LOADED: "install or load the NVIDIA driver (`nvidia-smi` must work)",
    LIBRARY_NOT_FOUND: "install the NVIDIA driver (libnvidia-ml.so.1 not found)",
}


class GpuDriverError(InfrastructureError):
    """The GPU driver (or the simulator standing in for it) refused an operation."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        self.code_name = CODE_NAMES.get(code, f"NVML_ERROR_{code}")
        advice = _ADVICE.get(code)
        super().__init__(f"{message} [{self.code_name}]" + (f": {advice}" if advice else ""))


class GpuNotSupported(GpuDriverError):
    pass


class GpuNoPermission(GpuDriverError):
    pass


class GpuInUse(GpuDriverError):
    pass


class GpuResetRequired(GpuDriverError):
    pass


class GpuInsufficientResources(GpuDriverError):
    pass


class GpuNotFound(GpuDriverError):
    pass


class NoGpuDriver(GpuDriverError):
    """No NVIDIA driver or NVML library on this machine."""


_BY_CODE: dict[int, type[GpuDriverError]] = {
    NOT_SUPPORTED: GpuNotSupported,
    NO_PERMISSION: GpuNoPermission,
    IN_USE: GpuInUse,
    RESET_REQUIRED: GpuResetRequired,
    INSUFFICIENT_RESOURCES: GpuInsufficientResources,
    NOT_FOUND: GpuNotFound,
    DRIVER_NOT_LOADED: NoGpuDriver,
    LIBRARY_NOT_FOUND: NoGpuDriver,
    FUNCTION_NOT_FOUND: NoGpuDriver,
}


def driver_error(code: int, message: str) -> GpuDriverError:
    """The calque error for an NVML error code (the one mapping both backends use)."""
    return _BY_CODE.get(code, GpuDriverError)(code, message)


class LayoutError(UsageError):
    """A MIG layout that cannot be applied to a card (names what is valid there)."""


class BusyInstancesError(RefusedError):
    """A change would destroy MIG instances that have running processes (needs ``force``)."""
