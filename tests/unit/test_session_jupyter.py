"""How ``calque session jupyter`` finds JupyterLab and what it pins (issue 36, part 4)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from calque.cli.session_jupyter import jupyter_lab_command, server_argv, tunnel_text
from calque.errors import UsageError


def test_no_jupyterlab_anywhere_names_the_package_to_install(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        jupyter_lab_command(str(tmp_path), python_has_it=False)
    assert "`jupyterlab`" in str(e.value) and "calque[notebooks]" in str(e.value)


def test_the_users_own_jupyter_lab_on_path_comes_first(tmp_path: Path) -> None:
    exe = tmp_path / "jupyter-lab"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert jupyter_lab_command(str(tmp_path), python_has_it=True) == [str(exe)]
    assert jupyter_lab_command(str(tmp_path / "none"), python_has_it=True) == [sys.executable, "-m", "jupyterlab"]


def test_the_address_and_port_are_pinned_after_the_users_arguments() -> None:
    argv = server_argv(["jupyter-lab"], 8899, ("--ServerApp.ip=0.0.0.0", "--notebook-dir=/data"))
    assert argv.index("--ServerApp.ip=127.0.0.1") > argv.index("--ServerApp.ip=0.0.0.0")  # the last one wins
    assert "--ServerApp.port=8899" in argv and "--ServerApp.port_retries=0" in argv
    text = tunnel_text("gpu 7", 8899, "abc", "s1", "12:00")
    assert "ssh -N -L 8899:127.0.0.1:8899 'gpu 7'" in text and "http://127.0.0.1:8899/lab?token=abc" in text
