"""Fixtures of the GPU tests: simulated hosts in temporary directories."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from calque.gpu.sim import SimGpu


@pytest.fixture
def make_sim(tmp_path: Path) -> Callable[..., SimGpu]:
    """``make_sim(["A100-40GB"], mig=True)``: a simulated host whose files live under tmp_path."""

    def make(cards: list[str] | None = None, **kw: object) -> SimGpu:
        return SimGpu.create(tmp_path / "gpus.json", cards, **kw)  # type: ignore[arg-type]

    return make
