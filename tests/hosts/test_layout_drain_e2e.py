"""A MIG layout change through ``calque.gpu.gpu_layout`` (``playbooks/site.yml``) on the estate's
booted 8x H100 host (p5.48xlarge; ``estate.py``) with live sessions: the role drains only the GPU whose
layout differs, waits for the session on a slice it destroys to end by its holder's hand
(``calque_gpu_layout_drain_wait``), changes it and undrains it; the session on another GPU never ends
and its slices never move; a second run changes nothing; outside ``calque_gpu_layout_window`` the
change is refused before anything changes (check mode says so). And ``calque session drain --by`` on
that host: the session on the drained GPU ends at the new deadline (reason ``drained``), the drain
outlives a restart of ``calque-session.service``, and ``undrain`` gives the GPU back. The checkouts name
GPUs (``--gpu N``) and go through the institution's queue with the broker up, pinned to this host and
GPU. And the one door (issue 39): a user's direct checkout on the host's own socket is refused while
the broker answers and served once the broker has been silent for the host's ``degraded_after``."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.waits import HANG_S, until

from .estate import FRONT, H100, Estate, recap
from .institution import INSTITUTION

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

AUDIT = "/var/log/calque/session-audit.jsonl"
PY = "/opt/calque/venv/bin/python"
# The layout's own part of site.yml (its preflight and MIG tasks) on this host alone, the estate converged.
ROLE = ("--limit", H100, "--tags", "gpu_layout_mig")


# A user's own direct checkout on the host's socket, around the CLI (what the one door refuses while
# the broker answers): the daemon's answer, one JSON line.
RAW_CHECKOUT = r"""
import json, socket
with socket.socket(socket.AF_UNIX) as s:
    s.connect("/run/calque/session.sock")
    s.sendall(json.dumps({"version": 1, "op": "checkout", "args": {"ttl": "10m"}}).encode() + b"\n")
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
print(buf.decode().strip())
"""


def _degraded(estate: Estate) -> bool:
    return "degraded mode" in estate.fleet.ssh(H100, "calque session list", user="bob", check=False).stderr


def _broker_sees(estate: Estate, gpu: int) -> str:
    """How the broker last saw GPU ``gpu`` of the H100 host: "drained", "free", "busy" or "unreachable"."""
    views = json.loads(estate.fleet.ssh(FRONT, "calque session list --all --json").stdout)
    v = next(v for v in views if v["name"] == H100)
    if not v["reachable"]:
        return "unreachable"
    mine = [st for st in v["slices"] if st["slice"]["gpu_index"] == gpu]
    return "drained" if any(st["drained"] for st in mine) else "free" if any(not st["busy"] for st in mine) else "busy"


def _layout_vars(estate: Estate, **more: Any) -> Path:
    """Extra vars: the institution's configs plus ``gpu0-whole`` (GPU 0 one 7g.80gb, the rest as before)."""
    teaching = yaml.safe_load((INSTITUTION / "group_vars" / "teaching.yml").read_text())
    configs = dict(teaching["calque_gpu_layout_mig_configs"])
    configs["gpu0-whole"] = [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}},
        {"devices": [1, 2, 3, 4, 5, 6, 7], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
    ]
    path = estate.fleet.dir / "layout-vars.yml"
    path.write_text(
        yaml.safe_dump({"calque_gpu_layout_mig_configs": configs, "calque_gpu_layout_mig_config": "gpu0-whole", **more})
    )
    return path


def _devices(estate: Estate) -> dict[int, list[str]]:
    """Each GPU's MIG device UUIDs, as ``calque gpu mig show`` reads them on the host."""
    shown = json.loads(estate.fleet.ssh(H100, "calque gpu mig show --json").stdout)
    return {
        g["index"]: sorted(ci["uuid"] for gi in g["instances"] for ci in gi["compute_instances"]) for g in shown["gpus"]
    }


def _as(estate: Estate, user: str, command: str) -> Any:
    return json.loads(estate.fleet.ssh(H100, command, user=user).stdout)


def _events(estate: Estate) -> list[dict[str, Any]]:
    return [json.loads(x) for x in estate.fleet.ssh(H100, f"cat {AUDIT}").stdout.splitlines() if x.strip()]


def test_a_layout_change_drains_only_the_changed_gpu_and_never_ends_a_session_on_the_others(
    estate: Estate,
) -> None:
    f = estate.fleet
    before = _devices(estate)
    assert sorted(before) == list(range(8)) and all(len(v) == 7 for v in before.values())

    # Outside the window: refused before anything changes; check mode says so.
    elsewhere = (datetime.now(timezone.utc) + timedelta(days=3)).strftime("%a")
    closed = _layout_vars(estate, calque_gpu_layout_window=[f"{elsewhere} 02:00-03:00"])
    checked = estate.site("drain-closed-check", "-e", f"@{closed}", *ROLE, "--check")
    assert checked.returncode == 0 and "outside the layout's change window" in checked.stdout, checked.stdout[-6000:]
    refused = estate.site("drain-closed", "-e", f"@{closed}", *ROLE)
    assert refused.returncode != 0 and "outside the layout's change window" in refused.stdout, refused.stdout[-6000:]
    assert _devices(estate) == before and not [e for e in _events(estate) if e["event"] == "drain"]

    # Bob on GPU 3 (its layout stays) for an hour; Alice on GPU 0 (its slices go) for 9 minutes, within the
    # role's drain wait (a session that outlives the wait is refused before anything changes).
    bob = _as(estate, "bob", "calque session checkout --gpu 3 --ttl 1h --json")
    alice = _as(estate, "alice", "calque session checkout --gpu 0 --ttl 9m --json")
    assert (bob["gpu_index"], alice["gpu_index"]) == (3, 0)

    # Inside (no window), with a wait long enough for Alice's deadline: the role drains GPU 0 and waits while
    # she works; when she checks in (the event itself, not a short deadline chosen to outlast a loaded
    # machine's playbook run), it changes the layout and undrains.
    wait = _layout_vars(estate, calque_gpu_layout_drain_wait=600)
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(estate.site, "drain-change", "-e", f"@{wait}", *ROLE)
        until(
            lambda: run.done() or any(e["event"] == "drain" for e in _events(estate)), "the role drains GPU 0", every=1
        )
        assert not run.done(), run.result().stdout[-6000:]  # it cannot be done: Alice still holds GPU 0
        assert alice["id"] in {s["id"] for s in _as(estate, "alice", "calque session status --json")}
        f.ssh(H100, f"calque session checkin {alice['id']}", user="alice")
        changed = run.result()
    assert changed.returncode == 0, changed.stdout[-6000:]
    after = _devices(estate)
    assert len(after[0]) == 1 and after[0] != before[0]
    assert {g: after[g] for g in range(1, 8)} == {g: before[g] for g in range(1, 8)}  # not one slice moved

    events = _events(estate)
    drains = [(e["event"], e.get("gpu")) for e in events if e["event"] in ("drain", "undrain")]
    assert drains == [("drain", 0), ("undrain", 0)], drains
    ends = {e["session"]: e["event"] for e in events if e["event"] in ("expiry", "release", "drained", "checkin")}
    assert ends.get(alice["id"]) == "checkin"  # ended by her own hand: never ended for the layout
    drained_at = next(e["ts"] for e in events if e["event"] == "drain")
    ended_at = next(e["ts"] for e in events if e.get("session") == alice["id"] and e["event"] == "checkin")
    undrained_at = next(e["ts"] for e in events if e["event"] == "undrain")
    assert drained_at < ended_at < undrained_at  # the role waited for her session
    assert bob["id"] not in ends
    status = _as(estate, "bob", "calque session status --json")
    assert [(s["id"], s["expires_at"]) for s in status] == [(bob["id"], bob["expires_at"])]
    assert json.loads(f.ssh(H100, "calque session drains --json").stdout) == []

    again = estate.site("drain-again", "-e", f"@{wait}", *ROLE)
    assert again.returncode == 0 and recap(again.stdout)[H100]["changed"] == 0, again.stdout[-6000:]
    assert len([e for e in _events(estate) if e["event"] == "drain"]) == 1
    f.ssh(H100, f"calque session checkin {bob['id']}", user="bob")  # the estate as it was, for the next module


def test_drain_by_ends_the_sessions_there_survives_a_service_restart_and_undrain_gives_the_gpu_back(
    estate: Estate,
) -> None:
    f = estate.fleet
    carol = _as(estate, "carol", "calque session checkout --gpu 5 --ttl 1h --json")
    drained = json.loads(f.ssh(H100, "calque session drain --gpu 5 --by 20s --reason 'fan swap' --json").stdout)
    assert drained["shortened"] == [carol["id"]] and drained["drain"]["by_user"] == "root"

    # Through the queue: the broker's answer names the drain (busy for now: exit 5, a later moment may serve it).
    until(lambda: _broker_sees(estate, 5) == "drained", "the broker sees GPU 5 drained")
    refused = f.ssh(H100, "calque session checkout --gpu 5 --ttl 10m", user="dave", check=False)
    assert refused.returncode == 5 and "GPU 5 is drained by root" in refused.stderr, refused.stderr
    assert "fan swap" in refused.stderr
    f.ssh(H100, "systemctl restart calque-session.service")  # a drain is in the registry, not the process
    until(lambda: _broker_sees(estate, 5) == "drained", "the broker lists the restarted host, GPU 5 drained")
    refused = f.ssh(H100, "calque session checkout --gpu 5 --ttl 10m", user="dave", check=False)
    assert refused.returncode == 5 and "fan swap" in refused.stderr, refused.stderr
    listed = f.ssh(H100, "calque session list", user="dave").stdout
    assert "drained: GPU 5 is drained by root" in listed
    assert 'calque_session_drained{gpu="5"} 1.0' in f.ssh(H100, "calque session metrics").stdout

    deadline = time.monotonic() + 20 + HANG_S  # the drain's deadline is 20 s away; past it, only a hang
    ends: list[str] = []
    while time.monotonic() < deadline and not ends:
        ends = [e["event"] for e in _events(estate) if e.get("session") == carol["id"] and e["event"] == "drained"]
        time.sleep(2)
    assert ends == ["drained"], [e for e in _events(estate) if e.get("session") == carol["id"]]
    assert _as(estate, "carol", "calque session status --json") == []
    notices = [e for e in _events(estate) if e.get("session") == carol["id"] and e["event"] == "drain_deadline"]
    assert len(notices) == 1 and notices[0]["reason"] == "fan swap"

    assert "fan swap" in f.ssh(H100, "calque session undrain --gpu 5").stdout
    # A place in the queue for GPU 5: granted as soon as the broker sees the undrain.
    dave = _as(estate, "dave", "calque session checkout --gpu 5 --ttl 10m --wait --wait-timeout 5m --json")
    assert dave["gpu_index"] == 5
    f.ssh(H100, f"calque session checkin {dave['id']}", user="dave")


def test_a_direct_checkout_is_refused_while_the_broker_answers_and_served_once_it_is_silent(estate: Estate) -> None:
    """Issue 39's one door on a booted host: dave's request on the host's own socket (around the CLI)
    is refused, naming the queue, while the broker answers; the broker stopped, once the host has
    heard nothing from it for ``degraded_after`` it serves him directly (degraded mode, audited); the
    broker back, the door closes again."""
    f = estate.fleet
    raw = f"{PY} -"
    answer = json.loads(f.ssh(H100, raw, user="dave", input=RAW_CHECKOUT).stdout)
    assert not answer["ok"] and answer["error"]["kind"] == "refused", answer
    assert (
        "institution's queue" in answer["error"]["message"] and "calque session checkout" in answer["error"]["message"]
    )
    f.ssh(FRONT, "systemctl stop calque-broker.service")
    try:
        until(lambda: _degraded(estate), "the H100 host serves directly once the broker is silent", every=1.0)
        served = json.loads(f.ssh(H100, raw, user="dave", input=RAW_CHECKOUT).stdout)
        assert served["ok"], served
        sid = served["result"]["id"]
        f.ssh(H100, f"calque session checkin {sid}", user="dave")
        doors = [
            (e["user"], e.get("door")) for e in _events(estate) if e.get("session") == sid and e["event"] == "checkout"
        ]
        assert doors == [("dave", "degraded")], doors
        assert any(e["event"] == "door_degraded" for e in _events(estate))
    finally:
        f.ssh(FRONT, "systemctl start calque-broker.service")
    until(lambda: not _degraded(estate), "the H100 host takes checkouts through the queue again", every=1.0)
    again = json.loads(f.ssh(H100, raw, user="dave", input=RAW_CHECKOUT).stdout)
    assert not again["ok"] and again["error"]["kind"] == "refused", again
