"""MPS slots are offered only while their GPU's control daemon answers, and its stop is noticed.

The host's L4 (GPU 1) has two MPS slots and a real stand-in control daemon on its pipe directory
(``tests/gpu/bin/nvidia-cuda-mps-control``, started by the fixture as ``calque gpu mps start`` would).
Killing it with SIGKILL leaves its socket file behind, as a crash does: only a listener counts.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from .conftest import Host, User, as_user, wait_for

pytestmark = pytest.mark.slow
CONSENT = "--i-understand-shared-gpu-has-no-isolation"


def _mps_states(host: Host, user: User) -> list[dict[str, Any]]:
    listed = json.loads(host.cli(user, "session", "list", "--json", check=True).stdout)
    return [st for st in listed if st["slice"]["kind"] == "mps"]


def _events(host: Host, event: str, sid: str) -> list[dict[str, Any]]:
    return [e for e in host.audit_events() if e["event"] == event and e["session"] == sid]


def test_a_stopped_mps_daemon_is_noticed_refused_to_others_and_offered_again_once_back(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice, bob = make_user(), make_user()
    host.start(reassert_every=0.3)
    control = host.mps_pipe(1) / "control"
    held = json.loads(host.cli(alice, "session", "checkout", "--mps", CONSENT, "--json", check=True).stdout)
    assert all(st["unavailable"] is False for st in _mps_states(host, bob))
    tty_m, tty_s = os.openpty()
    os.chown(os.ttyname(tty_s), alice.uid, -1)
    shell = subprocess.Popen(as_user(alice, ["/bin/sleep", "60"]), stdin=tty_s, stdout=tty_s, stderr=tty_s)
    try:
        host.kill_mps(1)
        assert control.exists()  # a stale socket: the file alone would say the daemon is up

        # The holder is told, once, on her terminal and in the audit trail; her session stays live.
        assert wait_for(lambda: bool(_events(host, "mps_down", held["id"])))
        os.set_blocking(tty_m, False)
        told = os.read(tty_m, 65536).decode(errors="replace")
        assert f"session {held['id']}" in told and "MPS control daemon of GPU 1 does not answer" in told, told
        (down,) = _events(host, "mps_down", held["id"])
        assert down["terminals"] == 1 and "nothing listens" in down["reason"], down

        def warned() -> bool:  # each daemon process asks a pipe at most once a second (MPS_PROBE_MAX_AGE_S)
            (mine,) = json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout)
            assert mine["id"] == held["id"], mine
            return any("GPU 1 does not answer" in w for w in mine["warnings"])

        assert wait_for(warned)
        assert "warning: the MPS control daemon of GPU 1" in host.cli(alice, "session", "status", check=True).stdout

        # Bob sees both slots unavailable, and why; his checkout is refused (exit 4) saying the same.
        states = _mps_states(host, bob)
        assert [st["unavailable"] for st in states] == [True, True], states
        assert all("systemctl restart calque-mps@1" in st["why_not"] for st in states), states
        assert "unavailable" in host.cli(bob, "session", "list", check=True).stdout
        res = host.cli(bob, "session", "checkout", "--mps", CONSENT)
        assert res.returncode == 4, res.stderr
        assert "no MPS slot can be offered now" in res.stderr and "GPU 1 does not answer" in res.stderr, res.stderr
        assert "nothing listens on" in res.stderr and "systemctl restart calque-mps@1" in res.stderr, res.stderr
        # A MIG checkout is none of its business.
        mig = host.cli(bob, "session", "checkout", "--json", check=True)
        host.cli(bob, "session", "checkin", json.loads(mig.stdout)["id"], check=True)

        # The daemon comes back: Alice is told, the slots are offered again (Bob's waits for Alice's
        # check-in under the serialised-per-user rule, as it would have before).
        host.start_mps(1)
        assert wait_for(lambda: bool(_events(host, "mps_up", held["id"])))
        assert "answers again" in os.read(tty_m, 65536).decode(errors="replace")
        assert wait_for(lambda: not any(st["unavailable"] for st in _mps_states(host, bob)))
        (mine,) = json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout)
        assert mine["warnings"] == [], mine
        assert host.cli(bob, "session", "checkout", "--mps", CONSENT).returncode == 5
        host.cli(alice, "session", "checkin", held["id"], check=True)
        res = host.cli(bob, "session", "checkout", "--mps", CONSENT, "--json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["user"] == bob.name
        assert len(_events(host, "mps_down", held["id"])) == 1  # told once, not on every tick
    finally:
        shell.kill()
        shell.wait()
        os.close(tty_m)
        os.close(tty_s)


def test_a_host_whose_mps_daemon_never_started_offers_no_slot(host: Host, make_user: Callable[..., User]) -> None:
    alice = make_user()
    host.start(mps=False)  # the slots are configured, no control daemon runs (calque-mps@1 not started)
    assert all(st["unavailable"] and "no control socket" in st["why_not"] for st in _mps_states(host, alice))
    res = host.cli(alice, "session", "checkout", "--mps", CONSENT)
    assert res.returncode == 4 and "no control socket at" in res.stderr, res.stderr
    assert not [e for e in host.audit_events() if e["event"] == "checkout"]
