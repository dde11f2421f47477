"""MPS control daemons as calque reports and plans them: the limits a person asks for, each daemon's
state, the steps of a start or stop and what they did. ``calque.gpu.mps_control`` (``MpsControl``) fills them
in; the operation (``calque.ops.mps``) and ``calque gpu info`` report them.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from calque.errors import UsageError
from calque.models.base import CalqueModel

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def pinned_bytes(limit: str) -> int:
    """A pinned-memory limit as bytes (``4G``, ``512M``, ``1024``); a UsageError for anything else."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*", limit.upper())
    if m is None:
        raise UsageError(f"pinned memory limit {limit!r}: write a size like 4G, 512M or 1024 (bytes)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


class MpsSettings(CalqueModel):
    """Default limits for every client of a daemon."""

    active_thread_percentage: int | None = Field(None, ge=1, le=100)
    pinned_memory_limit: str | None = Field(None, description="per-client pinned device memory, e.g. 8G")

    @field_validator("pinned_memory_limit")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        if v is not None:
            pinned_bytes(v)
        return v


class MpsUserModel(CalqueModel):
    """How the installed MPS treats clients of different Unix users."""

    mode: Literal["serialised-per-user", "multi-user"]
    evidence: str
    slot_policy: str


class MpsDaemon(CalqueModel):
    """One control daemon and what it reports."""

    target: str = Field(description="gpu<index> or mig-<uuid>")
    gpu_index: int
    device_uuid: str
    pipe_dir: str
    log_dir: str
    running: bool
    servers: list[int] = Field(default_factory=list, description="MPS server pids")
    active_thread_percentage: int | None = None
    pinned_memory_limit: str | None = None
    compute_mode: str | None = None


class MpsStatus(CalqueModel):
    version: int = 1
    daemons: list[MpsDaemon]
    user_model: MpsUserModel | None = None


class MpsResult(CalqueModel):
    """What start or stop did (or, in check mode, would do)."""

    version: int = 1
    changed: bool
    actions: list[str]
    daemons: list[MpsDaemon]


class MpsStep(CalqueModel):
    """One daemon's part of a start or stop: its actions, and its state before and (predicted) after."""

    target: str
    gpu_index: int
    device_uuid: str
    before: MpsDaemon
    after: MpsDaemon = Field(description="the daemon after the actions: what check mode predicts")
    actions: list[str] = Field(default_factory=list)
    compute_mode: str | None = Field(None, description="compute mode to set, if it changes")
    launch: bool = False
    quit: bool = False
    commands: list[str] = Field(default_factory=list, description="limit commands for the control program")
