"""Fixtures of the GPU tests: simulated hosts in temporary directories."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from calque.gpu.sim import SimGpu


@pytest.fixture
def make_sim(tmp_path: Path) -> Callable[..., SimGpu]:
    """``make_sim(["A100-40GB"], mig=True)``: a simulated host whose files live under tmp_path."""

    def make(cards: list[str] | None = None, **kw: object) -> SimGpu:
        return SimGpu.create(tmp_path / "gpus.json", cards, **kw)  # type: ignore[arg-type]

    return make


FAKE_BIN = Path(__file__).resolve().parent / "bin"


@pytest.fixture
def mps_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fake nvidia-cuda-mps-control first on PATH and a short root for pipe/log dirs (unix socket
    paths are limited to 108 bytes); every daemon it started is stopped afterwards."""
    root = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))
    # same program, run by this interpreter directly (a pyenv shim would add ~0.3 s per call)
    (root / "bin").mkdir()
    fake = root / "bin" / "nvidia-cuda-mps-control"
    body = (FAKE_BIN / "nvidia-cuda-mps-control").read_text().split("\n", 1)[1]
    fake.write_text(f"#!{sys.executable}\n{body}")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    yield root
    for pidfile in root.glob("pipe/*/nvidia-cuda-mps-control.pid"):
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def point_host_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[SimGpu], SimGpu]:
    """``point_host_config(sim)``: a host configuration selecting ``sim``, named by CALQUE_HOST_CONFIG."""

    def point(sim: SimGpu) -> SimGpu:
        cfg = tmp_path / "host.yaml"
        cfg.write_text(f"gpu:\n  backend: sim\n  sim: {{state: {sim.state_path}}}\n")
        monkeypatch.setenv("CALQUE_HOST_CONFIG", str(cfg))
        return sim

    return point
