"""Real users against a real daemon: who may do what to whose session, and who can reach the slice."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from calque.session.daemon.isolation import acl_users

from .conftest import Host, User, wait_for

pytestmark = pytest.mark.slow


def _nodes(host: Host, uuid: str) -> list[Path]:
    mig = next(m for m in host.migs if m.uuid == uuid)
    return [Path(p) for p in host.sim.capability_devices(mig)]


def _can_read(host: Host, user: User, path: Path) -> bool:
    return host.run_as(user, ["/usr/bin/test", "-r", str(path)]).returncode == 0


def test_other_user_cannot_touch_a_session_and_admin_can_release(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob = make_user(), make_user()
    admin = make_user(["cqadm" + alice.name[2:6]])
    host.start(policy={"admin_group": "cqadm" + alice.name[2:6], "default": {"max_sessions": 2, "max_ttl": "4h"}})

    out = host.cli(alice, "session", "checkout", "--profile", "1g.5gb", "--ttl", "1h", "--json", check=True)
    s = json.loads(out.stdout)
    assert s["user"] == alice.name and s["uid"] == alice.uid
    assert s["env"]["CUDA_VISIBLE_DEVICES"] == s["slice_id"] and s["slice_id"].startswith("MIG-")
    assert s["slice_id"] in {m.uuid for m in host.migs}

    # Bob can neither end, extend, release nor read Alice's session.
    for args in (["checkin", s["id"]], ["extend", s["id"], "--by", "10m"], ["release", s["id"], "--force"]):
        res = host.cli(bob, "session", *args)
        assert res.returncode == 4, (args, res.stdout, res.stderr)
    assert "not yours" in host.cli(bob, "session", "checkin", s["id"]).stderr
    assert [a["id"] for a in json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout)] == [s["id"]]
    bob_status = json.loads(host.cli(bob, "session", "status", "--json", check=True).stdout)
    assert bob_status == []
    bob_list = json.loads(host.cli(bob, "session", "list", "--json", check=True).stdout)
    row = next(r for r in bob_list if r["slice"]["id"] == s["slice_id"])
    assert row["busy"] and row["holder"] is None and row["session_id"] is None
    assert s["id"] not in json.dumps(bob_list)

    # The slice's capability nodes: Alice only.
    nodes = _nodes(host, s["slice_id"])
    assert len(nodes) == 2
    for n in nodes:
        st = n.stat()
        # Root's node, Alice's ACL entry: she can read it but not chmod it wider.
        assert st.st_uid == 0 and acl_users(n) == {alice.uid: 4} and stat.S_IMODE(st.st_mode) & 0o007 == 0
        assert _can_read(host, alice, n)
        assert not _can_read(host, bob, n)
    # A free slice's nodes are root's alone.
    free = next(m for m in host.migs if m.uuid != s["slice_id"])
    for n in _nodes(host, free.uuid):
        assert not _can_read(host, alice, n) and not _can_read(host, bob, n)

    # The admin sees holders and force-releases; the nodes go back to root.
    admin_list = json.loads(host.cli(admin, "session", "list", "--json", check=True).stdout)
    assert next(r for r in admin_list if r["slice"]["id"] == s["slice_id"])["holder"] == alice.name
    res = host.cli(admin, "session", "release", s["id"], "--force", "--reason", "hung job", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["end_reason"] == "released"
    for n in nodes:
        assert n.stat().st_uid == 0 and stat.S_IMODE(n.stat().st_mode) == 0o400
        assert not _can_read(host, alice, n)
    assert json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout) == []
    events = [(e["event"], e["uid"], e["by_uid"]) for e in host.audit_events()]
    assert ("checkout", alice.uid, alice.uid) in events and ("release", alice.uid, admin.uid) in events
    assert [e["reason"] for e in host.audit_events() if e["event"] == "release"] == ["released: hung job"]


def test_checkin_returns_nodes_to_root_and_slice_to_pool(host: Host, make_user: Callable[..., User]) -> None:
    alice = make_user()
    host.start()
    s = json.loads(host.cli(alice, "session", "checkout", "--json", check=True).stdout)
    nodes = _nodes(host, s["slice_id"])
    assert all(_can_read(host, alice, n) for n in nodes)
    res = host.cli(alice, "session", "checkin", "--json")  # her only session: no id needed
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["end_reason"] == "checkin"
    for n in nodes:
        assert n.stat().st_uid == 0 and not _can_read(host, alice, n)
    listing = json.loads(host.cli(alice, "session", "list", "--json", check=True).stdout)
    assert not any(r["busy"] for r in listing)
    again = host.cli(alice, "session", "checkin", s["id"])  # ended already: said so, nothing else ends
    assert again.returncode == 2 and f"no live session {s['id']}" in again.stderr, again.stderr
    assert [e["event"] for e in host.audit_events()].count("checkin") == 1


def test_eval_shell_sets_environment_in_real_bash(host: Host, make_user: Callable[..., User]) -> None:
    alice = make_user()
    host.start()
    wrapper = host.dir / "bin/calque"
    wrapper.parent.mkdir(mode=0o755)
    wrapper.write_text(f'#!/bin/sh\nexec {" ".join(host.python)} -c "$CALQUE_CLI" "$@"\n')
    wrapper.chmod(0o755)
    from .conftest import CLI

    env = {**host.env, "PATH": f"{wrapper.parent}:{host.env['PATH']}", "CALQUE_CLI": CLI}
    env["CALQUE_SESSION_SOCKET"] = str(host.socket)
    script = (
        'eval "$(calque session checkout --ttl 30m --shell)" && echo "cvd=$CUDA_VISIBLE_DEVICES id=$CALQUE_SESSION_ID"'
    )
    res = host.run_as(alice, ["/bin/bash", "-c", script], env=env)
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip().splitlines()[-1]
    assert "cvd=MIG-" in line, (res.stdout, res.stderr)
    cvd, sid = line.split()[0].removeprefix("cvd="), line.split()[1].removeprefix("id=")
    assert cvd in {m.uuid for m in host.migs}
    mine = json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout)
    assert [(m["id"], m["slice_id"]) for m in mine] == [(sid, cvd)]


def test_mps_needs_consent_gives_limits_and_keeps_one_user_per_daemon(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice, bob = make_user(), make_user()
    host.start()
    res = host.cli(alice, "session", "checkout", "--mps")
    assert res.returncode == 4 and "i-understand-shared-gpu-has-no-isolation" in res.stderr
    res = host.cli(alice, "session", "checkout", "--mps", "--i-understand-shared-gpu-has-no-isolation", "--json")
    assert res.returncode == 0, res.stderr
    env = json.loads(res.stdout)["env"]
    l4 = next(g for g in host.sim.gpus() if g.index == 1)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(host.dir / "mps/gpu1")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    assert env["CUDA_VISIBLE_DEVICES"] == l4.uuid
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(host.dir / "mps-log/gpu1")
    # MPS serialises different users' clients on one daemon: Bob is not offered the free slot...
    consent = "--i-understand-shared-gpu-has-no-isolation"
    res = host.cli(bob, "session", "checkout", "--mps", consent)
    assert res.returncode == 5 and "MPS serialises" in res.stderr, res.stderr
    # ...while Alice may take it, and Bob gets one once Alice's are all back.
    host.cli(alice, "session", "checkout", "--mps", consent, check=True)
    for s in json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout):
        host.cli(alice, "session", "checkin", s["id"], check=True)
    assert host.cli(bob, "session", "checkout", "--mps", consent).returncode == 0


def test_nothing_free_exits_5_naming_what_is_busy_until_when(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob = make_user(), make_user()
    host.start()
    for _ in range(7):
        host.cli(alice, "session", "checkout", "--profile", "1g.5gb", "--ttl", "2h", check=True)
    res = host.cli(bob, "session", "checkout", "--profile", "1g.5gb")
    assert res.returncode == 5
    assert "busy" in res.stderr and "until" in res.stderr and host.migs[0].uuid in res.stderr


def test_group_limit_counts_the_whole_group(host: Host, make_user: Callable[..., User]) -> None:
    # Slurm's GrpTRES meaning: a group's max_sessions is what all its members hold together; each
    # member still has their own (default) limit, and max_ttl stays a per-session limit.
    grp_name = "cqlab" + os.urandom(2).hex()
    alice, carol = make_user([grp_name]), make_user([grp_name])
    bob = make_user()
    host.start(
        max_total_ttl="3h",
        policy={
            "default": {"max_sessions": 2, "max_ttl": "1h"},
            "groups": {grp_name: {"max_sessions": 2, "max_ttl": "2h"}},
        },
    )
    host.cli(alice, "session", "checkout", "--ttl", "2h", check=True)  # the group's max_ttl
    host.cli(carol, "session", "checkout", "--ttl", "1h", check=True)
    res = host.cli(alice, "session", "checkout")  # her own limit is 2, but the group holds 2
    assert res.returncode == 4 and f"group {grp_name} holds 2" in res.stderr, res.stderr
    assert host.cli(carol, "session", "checkout").returncode == 4
    # Bob is in no limited group: his own limit (2) alone applies, and the default max_ttl (1h).
    assert host.cli(bob, "session", "checkout", "--ttl", "2h").returncode == 4
    s = json.loads(host.cli(bob, "session", "checkout", "--ttl", "30m", "--json", check=True).stdout)
    host.cli(bob, "session", "checkout", "--ttl", "30m", check=True)
    ext = host.cli(bob, "session", "extend", s["id"], "--by", "20m", "--json")
    assert ext.returncode == 0, ext.stderr
    assert json.loads(ext.stdout)["expires_at"] > s["expires_at"]
    over = host.cli(bob, "session", "extend", s["id"], "--by", "20m")
    assert over.returncode == 4 and "at most" in over.stderr
    # One member checks in: the group has room again, for any member.
    host.cli(alice, "session", "checkin", check=True)
    host.cli(carol, "session", "checkout", "--ttl", "30m", check=True)
    assert host.cli(alice, "session", "checkout").returncode == 4


def test_nodes_reset_behind_the_daemons_back_are_secured_again(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob = make_user(), make_user()
    host.start(reassert_every=0.3)
    s = json.loads(host.cli(alice, "session", "checkout", "--json", check=True).stdout)
    held = _nodes(host, s["slice_id"])
    free = _nodes(host, next(m.uuid for m in host.migs if m.uuid != s["slice_id"]))
    # What the driver does to a new MIG device's nodes, or to any when DeviceFileModify is 1.
    for n in held + free:
        os.chown(n, 0, 0)
        n.chmod(0o444)
    # (The daemon's inotify watch usually closes them before Bob can even try; the timer's re-check
    # would within reassert_every.)
    assert wait_for(lambda: not _can_read(host, bob, free[0]) and not _can_read(host, bob, held[0]))
    assert all(n.stat().st_uid == 0 and acl_users(n) == {alice.uid: 4} for n in held) and _can_read(
        host, alice, held[0]
    )
    assert all(n.stat().st_uid == 0 and stat.S_IMODE(n.stat().st_mode) == 0o400 for n in free)


def test_list_marks_the_mps_slots_a_caller_would_be_refused_and_why(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob = make_user(), make_user()
    host.start()
    consent = "--i-understand-shared-gpu-has-no-isolation"
    held = json.loads(host.cli(alice, "session", "checkout", "--mps", consent, "--json", check=True).stdout)

    def free_mps(user: User) -> list[dict[str, object]]:
        listed = json.loads(host.cli(user, "session", "list", "--json", check=True).stdout)
        return [st for st in listed if st["slice"]["kind"] == "mps" and not st["busy"]]

    # Bob: the L4's other slot is free, but not his (another user's clients are on its MPS daemon).
    (bobs,) = free_mps(bob)
    assert bobs["why_not"] is not None and "MPS serialises" in bobs["why_not"], bobs
    assert alice.name not in bobs["why_not"]  # who holds it is not his to know
    res = host.cli(bob, "session", "checkout", "--mps", consent)
    assert res.returncode == 5, res.stderr  # the list said so, the checkout agrees
    human = host.cli(bob, "session", "list", check=True).stdout
    assert "WHY NOT" in human and "not yours" in human, human
    # Alice may take it: nothing marked for her; once she is done, nothing for Bob either.
    (alices,) = free_mps(alice)
    assert alices["why_not"] is None
    host.cli(alice, "session", "checkin", held["id"], check=True)
    assert [st["why_not"] for st in free_mps(bob)] == [None, None]
    assert "WHY NOT" not in host.cli(bob, "session", "list", check=True).stdout
