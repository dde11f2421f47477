"""The sandbox's institution step on a machine that cannot boot test hosts: it says so and why, then
shows a local simulated host (the teaching layout applied, the daemon as the sandbox's user, a slice
checked out, listed and checked in) and exits 0; it boots nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .paths import REPO, RUNS_DIR


def test_sandbox_shows_a_local_simulated_host_where_hosts_cannot_boot(tmp_path: Path) -> None:
    # No systemd-nspawn, debootstrap, ip or ssh on this PATH: as on a machine without them.
    bare = tmp_path / "bin"
    bare.mkdir()
    state = tmp_path / "local-host"
    env = {**os.environ, "PATH": str(bare), "CALQUE_SANDBOX_LOCAL_HOST_DIR": str(state)}
    env.pop("CALQUE_SESSION_SOCKET", None)
    r = subprocess.run(
        [sys.executable, "-m", "tests.hosts.sandbox"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert "institution: no booted host (site.yml on a booted session host" in out
    why = next(line for line in out.splitlines() if "Why:" in line)
    assert "this machine cannot boot test hosts:" in why
    if os.geteuid() == 0:
        assert "apt-get install" in why and "systemd-container" in why and "debootstrap" in why
    else:
        assert "needs root" in why
    assert "a LOCAL SIMULATED HOST instead of a booted one" in out
    # The teaching group's layout (4 x 1g.24gb on an RTX PRO 6000), then a checkout, the list, a checkin.
    assert out.count("create 1g.24gb at") == 4
    sid = re.search(r"session (s-[0-9a-f]+): MIG-\S+ \(1g\.24gb, gpu 0\)", out)
    assert sid, out
    listing = out.split("(local): calque session list")[1].split("(local): calque session checkin")[0]
    assert len(re.findall(r"MIG-\S+\s+mig\s+1g\.24gb\s+0\s+busy", listing)) == 1
    assert len(re.findall(r"MIG-\S+\s+mig\s+1g\.24gb\s+0\s+free", listing)) == 3
    assert f"session {sid.group(1)} on MIG-" in out and "ended (checkin)" in out
    assert "the daemon exited 0" in out
    # Its registry and audit trail are the real files, private to the user.
    assert (state / "state/sessions.db").stat().st_mode & 0o077 == 0
    assert '"checkin"' in (state / "log/session-audit.jsonl").read_text()
    assert "booting session host" not in out and not (RUNS_DIR / "sandbox").exists()
