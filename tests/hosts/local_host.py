"""The sandbox's institution part where no host can be booted: a local simulated host instead.

No Debian container, no ssh, no ``site.yml``: the same teaching layout and session settings the
institution inventory gives, applied here through the commands the roles themselves call, in a
private directory (``.sandbox/local-host``) as the user running the sandbox. The session daemon runs
as that user on a unix socket there, over a simulated RTX PRO 6000; you check a slice out and in.
What it cannot show without root is said out loud: no second Unix user, no root-owned nodes, no
systemd scope (cgroups: off).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from .paths import HANG_S, REPO

CARD = "RTX-PRO-6000-Blackwell-Server-Edition"
TEACHING = REPO / "playbooks/inventories/institution/group_vars/teaching.yml"


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def indent(text: str) -> None:
    for line in text.rstrip().splitlines():
        print(f"  {line}", flush=True)


def calque_exe() -> str:
    """The calque on PATH (the sandbox puts .venv/bin first), else the checkout's own."""
    return shutil.which("calque") or str(REPO / ".venv/bin/calque")


def calque(*args: str, env: dict[str, str], cwd: Path) -> str:
    """``calque ARGS`` as the sandbox's user; a failure ends the step with calque's own message."""
    r = subprocess.run([calque_exe(), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise LocalHostError(f"calque {' '.join(args)} exited {r.returncode}: {(r.stderr or r.stdout).strip()}")
    return r.stdout


class LocalHostError(Exception):
    """A step of the local simulated host failed (the sandbox exits 3 with this message)."""


def session_config(state: Path, group_vars: dict[str, Any]) -> dict[str, Any]:
    """The session daemon's config from the teaching group_vars, as the session_service role writes
    it, with every path inside ``state`` and the simulated GPUs; cgroups off (no root here)."""
    limits = group_vars["calque_session_service_default_limits"]
    return {
        "version": 1,
        "socket": str(state / "session.sock"),
        "db": str(state / "state/sessions.db"),
        "audit_log": str(state / "log/session-audit.jsonl"),
        "gpu_backend": "sim",
        "sim_state": str(state / "gpus.json"),
        "default_ttl": group_vars["calque_session_service_default_ttl"],
        "max_total_ttl": group_vars["calque_session_service_max_total_ttl"],
        "policy": {"default": limits, "admin_group": None},  # no admin group on a one-user host
        "cgroups": "off",
        **group_vars.get("calque_session_service_settings", {}),
    }


def wait_for_socket(path: Path, proc: subprocess.Popen[bytes], log: Path, timeout: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LocalHostError(f"the session daemon exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(path))
                return
        except OSError:
            time.sleep(0.05)
    raise LocalHostError(f"the session daemon did not listen on {path} in {timeout:.0f} s (a hang); see {log}")


def state_dir() -> Path:
    """Where the local host lives: ``.sandbox/local-host``, or ``CALQUE_SANDBOX_LOCAL_HOST_DIR``."""
    return Path(os.environ.get("CALQUE_SANDBOX_LOCAL_HOST_DIR") or REPO / ".sandbox/local-host")


def run(why: str, state: Path) -> int:
    """The local simulated host, end to end, in ``state`` (made afresh); 0 when every step worked, 3
    when one failed."""
    t0 = time.monotonic()
    say("institution: a LOCAL SIMULATED HOST instead of a booted one")
    indent(f"Why: {why}")
    indent("No container, no ssh, no site.yml here: the teaching group's layout and session settings are")
    indent("applied by the commands the roles call, as you, in .sandbox/local-host (one user, no root-owned")
    indent("nodes, no systemd scope). tests/hosts/test_site_e2e.py runs the real thing on booted hosts.")
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True, mode=0o700)
    state.chmod(0o700)  # the daemon refuses a state directory others can write (as munged does)
    for sub in ("state", "log"):
        (state / sub).mkdir(mode=0o700)
    env = {**os.environ, "CALQUE_SESSION_SOCKET": str(state / "session.sock")}
    env.pop("CALQUE_SESSION_SERVICE_USER", None)
    group_vars = yaml.safe_load(TEACHING.read_text())
    daemon: subprocess.Popen[bytes] | None = None
    try:
        say(f"institution (local): calque gpu sim create --card {CARD} --mig")
        gpus = str(state / "gpus.json")
        indent(calque("gpu", "sim", "create", "--card", CARD, "--mig", "--sim-state", gpus, env=env, cwd=state))
        layout = state / "layout.yaml"
        name = group_vars["calque_gpu_layout_mig_config"]
        layout.write_text(yaml.safe_dump({"version": "v1", "mig-configs": group_vars["calque_gpu_layout_mig_configs"]}))
        say(
            f"institution (local): calque gpu mig apply --select {name} (the teaching layout, as gpu_layout applies it)"
        )
        indent(
            calque(
                "gpu",
                "mig",
                "apply",
                "--config",
                str(layout),
                "--select",
                name,
                "--sim-state",
                gpus,
                env=env,
                cwd=state,
            )
        )
        config = state / "session.yaml"
        config.write_text(yaml.safe_dump(session_config(state, group_vars), sort_keys=False))
        config.chmod(0o600)
        say("institution (local): calque session serve --config .sandbox/local-host/session.yaml (the daemon, as you)")
        log = state / "daemon.log"
        with log.open("ab") as out:
            daemon = subprocess.Popen(
                [calque_exe(), "session", "serve", "--config", str(config)],
                env=env,
                cwd=state,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for_socket(state / "session.sock", daemon, log)
        indent(f"pid {daemon.pid}, socket {state / 'session.sock'}")
        say("institution (local): calque session checkout --profile 1g.24gb --ttl 30m")
        indent(calque("session", "checkout", "--profile", "1g.24gb", "--ttl", "30m", env=env, cwd=state))
        say("institution (local): calque session list")
        indent(calque("session", "list", env=env, cwd=state))
        say("institution (local): calque session checkin")
        indent(calque("session", "checkin", env=env, cwd=state))
    except LocalHostError as e:
        say(f"institution (local): failed: {e}")
        return 3
    finally:
        if daemon is not None:
            say("institution (local): teardown (SIGTERM to the daemon)")
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(5)
            indent(f"the daemon exited {daemon.returncode}")
    say(f"institution (local): done in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(run(" ".join(sys.argv[1:]) or "asked for by hand", state_dir()))
