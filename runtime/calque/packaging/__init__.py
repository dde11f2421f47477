"""Packaging the runtime: the reproducible calque wheel (``wheel``) and the pinned wheelhouse (``wheelhouse``)."""

from calque.packaging.wheel import build_wheel, sha256_file, wheel_name
from calque.packaging.wheelhouse import Wheelhouse, build_wheelhouse, notebooks_pins, runtime_pins

__all__ = [
    "Wheelhouse",
    "build_wheel",
    "build_wheelhouse",
    "notebooks_pins",
    "runtime_pins",
    "sha256_file",
    "wheel_name",
]
