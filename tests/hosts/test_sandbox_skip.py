"""The sandbox's institution step on a machine that cannot boot test hosts: it says it skipped, what,
and why, exits 0 (the pool part before it ran), and makes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .paths import REPO, RUNS_DIR


def test_sandbox_institution_says_what_it_skipped_and_why_where_hosts_cannot_boot(tmp_path: Path) -> None:
    # No systemd-nspawn, debootstrap, ip or ssh on this PATH: as on a machine without them.
    env = {**os.environ, "PATH": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-m", "tests.hosts.sandbox"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "institution: SKIPPED, nothing of it ran (site.yml on a booted session host" in r.stdout
    assert "Why: this machine cannot boot test hosts:" in r.stdout
    why = next(line for line in r.stdout.splitlines() if "Why:" in line)
    if os.geteuid() == 0:
        assert "apt-get install" in why and "systemd-container" in why and "debootstrap" in why
    else:
        assert "needs root" in why
    assert "booting session host" not in r.stdout and not (RUNS_DIR / "sandbox").exists()
