"""End to end: ``playbooks/site.yml`` with the institution's own group_vars on the booted estate
(``estate.py``: two teaching MIG hosts of RTX PRO 6000 shape, a teaching 8x H100 MIG host, a research
L40S MPS host, a front-door host), then what users and IT would see: a second run changes nothing;
two users check slices out over ssh and each can open only their own capability nodes; one checks
in, the other's session expires at its deadline; a restarted host re-applies its MIG layout at boot
(``calque-gpu.service``) and its session service comes back with its sessions; a session is a systemd
scope that ends with everything started in it; an MPS group without the consent is refused before
any change; Debian's logrotate rotates the session audit trail and the daemon follows.

The hosts stand for hosts with a working driver (an AWS Deep Learning AMI): the stand-in
``nvidia-smi`` of tests/roles answers 580, so the driver role keeps it, and its extras come from the
stand-in apt repository; the GPUs are calque's simulator of each host's shape.
"""

from __future__ import annotations

import json
import shlex
import time
from datetime import datetime
from pathlib import Path

import pytest
from support.waits import HANG_S, until

from .estate import ALL, H100, RESEARCH, TEACH_A, Estate, recap
from .fleet import Fleet

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

MIG, MPS = TEACH_A, RESEARCH  # the RTX PRO 6000 teaching host most tests use, the L40S MPS host
CONSENT = "calque_gpu_layout_mps_i_understand_mps_shares_memory"


def test_site_converges_every_host_and_a_second_run_changes_nothing(estate: Estate) -> None:
    first = estate.first  # the estate fixture's run of site.yml
    assert first is not None and set(recap(first.stdout)) == set(ALL)
    second = estate.site("second")
    assert second.returncode == 0, second.stdout[-6000:]
    changed = {h: r["changed"] for h, r in recap(second.stdout).items()}
    assert changed == dict.fromkeys(ALL, 0), second.stdout[-6000:]
    # What the layout gave each teaching host (institution's teaching-small) and the MPS daemon.
    rtx = json.loads(estate.fleet.ssh(MIG, "calque gpu mig show --json").stdout)
    h100 = json.loads(estate.fleet.ssh(H100, "calque gpu mig show --json").stdout)
    assert "1g.24gb" in json.dumps(rtx) and "1g.10gb" in json.dumps(h100)
    assert (
        estate.fleet.ssh(MPS, "systemctl is-active calque-mps.target calque-session.service").stdout.split()
        == ["active"] * 2
    )


def unit(fleet: Fleet, host: str, name: str, *props: str) -> dict[str, str]:
    out = fleet.ssh(host, f"systemctl show {name} " + " ".join(f"-p {p}" for p in props)).stdout
    return {k: v for k, _, v in (line.partition("=") for line in out.splitlines())}


# The runtime, gpu_layout and session_service roles have no molecule scenario of their own: site.yml
# here converges all three on four GPU hosts and a second run changes nothing (the test above); this test
# checks what each one leaves on a host, the checks their scenarios made (tests/hosts/README.md).
def test_each_role_left_what_its_readme_promises(estate: Estate, wheelhouse: Path) -> None:
    f = estate.fleet
    sums = [line.split() for line in (wheelhouse / "SHA256SUMS").read_text().splitlines()]
    wheel_sha = next(sha for sha, name in sums if name.lstrip("*").startswith("calque-"))
    imports = "import boto3, pydantic, yaml, pynvml, calque; print(calque.__version__)"
    for host in (MIG, H100, MPS):
        # runtime: calque on PATH for any user, from the staged wheel (sha256 recorded), with its
        # pinned dependencies importable (the hosts reach no index), and /etc/calque/host.yaml.
        version = f.ssh(host, "runuser -u nobody -- calque --version").stdout.split()[-1]
        assert f.ssh(host, "readlink /usr/local/bin/calque").stdout.strip() == "/opt/calque/venv/bin/calque"
        assert f.ssh(host, "cat /opt/calque/venv/calque-wheel.sha256").stdout.strip() == wheel_sha
        assert f.ssh(host, f"/opt/calque/venv/bin/python -c '{imports}'").stdout.strip() == version
        assert f.ssh(host, "stat -c '%U %a' /etc/calque/host.yaml").stdout.strip() == "root 644"
        # session_service: the packaged hardened unit, enabled and running the venv's calque, and the
        # configuration calque loads from this host's group_vars.
        s = unit(f, host, "calque-session.service", "ActiveState", "UnitFileState", "ExecStart", "ProtectSystem")
        assert (s["ActiveState"], s["UnitFileState"], s["ProtectSystem"]) == ("active", "enabled", "strict")
        assert "/opt/calque/venv/bin/calque session serve" in s["ExecStart"]
        check = f.ssh(host, "calque config check session /etc/calque/session.yaml --json").stdout
        summary = json.loads(check)["summary"]
        expected = (7200, ["teaching-staff"]) if host != MPS else (28800, ["nlp-group"])
        assert (summary["default_ttl_s"], summary["group_limits"]) == expected
    # gpu_layout, MIG: the teaching-small config on each card, and the boot unit before sessions and MPS.
    rtx = json.loads(f.ssh(MIG, "calque gpu mig show --json").stdout)["gpus"]
    h100 = json.loads(f.ssh(H100, "calque gpu mig show --json").stdout)["gpus"]
    assert [i.split("@")[0] for i in rtx[0]["layout"]["instances"]] == ["1g.24gb"] * 4
    assert len(h100) == 8 and all([i.split("@")[0] for i in g["layout"]["instances"]] == ["1g.10gb"] * 7 for g in h100)
    for host in (MIG, H100):
        g = unit(f, host, "calque-gpu.service", "UnitFileState", "ActiveState", "ExecStart", "Before")
        assert (g["UnitFileState"], g["ActiveState"]) == ("enabled", "active")
        assert "/opt/calque/venv/bin/calque gpu mig apply --config /etc/calque/mig-layout.yaml" in g["ExecStart"]
        assert {"calque-session.service", "calque-mps.target"} <= set(g["Before"].split())
    # gpu_layout, MPS: one daemon on the L40S under calque-mps.target, run by the venv's calque.
    m = unit(f, MPS, "calque-mps@0.service", "ActiveState", "ExecStart", "PartOf")
    assert m["ActiveState"] == "active" and m["PartOf"] == "calque-mps.target"
    assert "path=/opt/calque/venv/bin/calque" in m["ExecStart"]
    daemons = json.loads(f.ssh(MPS, "calque gpu mps status --json").stdout)["daemons"]
    assert [(d["running"], d["compute_mode"]) for d in daemons] == [(True, "EXCLUSIVE_PROCESS")]


def test_users_open_only_their_own_slices_one_checks_in_the_other_expires_on_time(estate: Estate) -> None:
    a = json.loads(estate.as_user("alice", "calque session checkout --profile 1g.24gb --ttl 1h --json").stdout)
    b = json.loads(estate.as_user("bob", "calque session checkout --profile 1g.24gb --ttl 25s --json").stdout)
    assert a["user"] == "alice" and b["user"] == "bob" and a["slice_id"] != b["slice_id"]
    a_nodes, b_nodes = estate.nodes(a["slice_id"]), estate.nodes(b["slice_id"])
    assert len(a_nodes) == len(b_nodes) == 2
    assert all(estate.can_read("alice", n) and not estate.can_read("bob", n) for n in a_nodes)
    assert all(estate.can_read("bob", n) and not estate.can_read("alice", n) for n in b_nodes)

    estate.as_user("alice", "calque session checkin")
    assert json.loads(estate.as_user("alice", "calque session status --json").stdout) == []
    assert not any(estate.can_read("alice", n) for n in a_nodes)

    deadline = datetime.fromisoformat(b["expires_at"]).timestamp()
    until(
        lambda: not json.loads(estate.as_user("bob", "calque session status --json").stdout),
        "bob's session ended",
        every=1,
    )
    assert time.time() >= deadline - 1, "bob's session ended before its deadline"
    assert not any(estate.can_read("bob", n) for n in b_nodes)


def test_restarted_host_reapplies_its_layout_and_keeps_its_sessions(estate: Estate) -> None:
    f = estate.fleet
    s = json.loads(estate.as_user("alice", "calque session checkout --profile 1g.24gb --ttl 1h --json").stdout)
    before = json.loads(f.ssh(MIG, "calque gpu mig show --json").stdout)
    f.restart(MIG)
    # /run (the simulated driver's state) is empty after a boot, as a real GPU's MIG instances are gone:
    # only calque-gpu.service can have laid the slices out again.
    assert f.ssh(MIG, "systemctl show -p Result --value calque-gpu.service").stdout.strip() == "success"
    assert json.loads(f.ssh(MIG, "calque gpu mig show --json").stdout) == before
    assert f.ssh(MIG, "systemctl is-active calque-session.service").stdout.strip() == "active"
    status = json.loads(estate.as_user("alice", "calque session status --json").stdout)
    assert [x["id"] for x in status] == [s["id"]]
    nodes = estate.nodes(s["slice_id"])
    assert all(estate.can_read("alice", n) and not estate.can_read("bob", n) for n in nodes)
    estate.as_user("alice", "calque session checkin")


def test_a_session_is_a_systemd_scope_and_everything_started_in_it_ends_with_it(estate: Estate) -> None:
    f = estate.fleet
    s = json.loads(estate.as_user("alice", "calque session checkout --profile 1g.24gb --ttl 1h --json").stdout)
    scope = f"calque-{s['id']}.scope"
    # A job started in the session, with a child that tries to leave it (a new session, detached),
    # then alice logs out: the job lives on, in the session's scope.
    estate.as_user(
        "alice",
        "nohup calque session run -- bash -c 'setsid sleep 901 & exec sleep 900' >/tmp/job.out 2>&1 </dev/null &",
    )
    sleeping = "pgrep -u alice -x sleep || true"
    deadline = time.monotonic() + HANG_S
    while len(pids := f.ssh(MIG, sleeping).stdout.split()) < 2:
        if time.monotonic() > deadline:
            said = f.ssh(
                MIG, f"cat /tmp/job.out; systemctl status --no-pager {scope}; journalctl --no-pager -n 30", check=False
            ).stdout
            raise AssertionError(f"the job started with calque session run never ran:\n{said}")
        time.sleep(0.2)
    show = f.ssh(MIG, f"systemctl show -p ActiveState -p Slice -p ControlGroup -p DevicePolicy {scope}").stdout
    props = dict(line.split("=", 1) for line in show.split())
    assert props["ActiveState"] == "active" and props["Slice"] == "calque.slice"
    # The device allow-list (devices.py): NVIDIA's groups closed; the simulator's nodes are plain
    # files, so here no node is let back in by path, and every other driver's group stays open.
    assert props["DevicePolicy"] == "closed"
    allow = f.ssh(MIG, f"systemctl show -p DeviceAllow --value {scope}").stdout
    assert "char-nvidia-uvm rwm" in allow and "char-[!n]* rwm" in allow and "/dev/" not in allow
    # cgroup v2 is at /sys/fs/cgroup, or at /sys/fs/cgroup/unified on a hybrid host (as these are here).
    v2 = f.ssh(
        MIG, "test -d /sys/fs/cgroup/unified && echo /sys/fs/cgroup/unified || echo /sys/fs/cgroup"
    ).stdout.strip()
    procs_file = f"{v2}{props['ControlGroup']}/cgroup.procs"
    in_scope = f.ssh(MIG, f"cat {procs_file}").stdout.split()
    assert set(pids) <= set(in_scope), f"{pids} not all in {scope}: {in_scope}"
    # The holder cannot move her own job out of the session's cgroup into her login's (only root writes there).
    mine = f.ssh(MIG, "sed -n 's/^0:://p' /proc/self/cgroup", user="alice").stdout.strip()
    f.ssh(MIG, f"test -e {v2}{mine}/cgroup.procs")  # it exists: a refusal below is about permission
    moved = estate.as_user("alice", f"echo {pids[0]} > {v2}{mine}/cgroup.procs", check=False)
    assert moved.returncode != 0 and "Permission denied" in moved.stderr, moved.stderr
    assert pids[0] in f.ssh(MIG, f"cat {procs_file}").stdout.split()

    estate.as_user("alice", "calque session checkin")
    until(
        lambda: not f.ssh(MIG, sleeping).stdout.split(), "the processes of a checked-in session end with it", every=0.2
    )
    # The daemon asks systemd to stop the emptied scope (StopUnit): systemd's own notice that a cgroup
    # emptied can be lost on these hybrid-hierarchy hosts, which once left the scope active 300 s on.
    deadline = time.monotonic() + HANG_S
    while (state := f.ssh(MIG, f"systemctl show -p ActiveState --value {scope}").stdout.strip()) != "inactive":
        assert time.monotonic() < deadline, f"{scope} is still {state} {HANG_S:g} s after its processes ended (a hang)"
        time.sleep(0.2)


HOLD = "import os, sys, time\nfd = os.open(sys.argv[1], os.O_RDONLY)\nprint('holding', flush=True)\ntime.sleep(600)\n"
# Bob, as himself: joins the institution's queue for a 1g.24gb slice on this host (a plain checkout
# on a host of the institution goes through its broker, `--wait` being his place in its queue) and
# says, the moment his checkout has answered, which of the given pids still run.
TAKE_OVER = """\
import json, subprocess, sys
from pathlib import Path
def running(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
print("ready", flush=True)
cmd = ["/opt/calque/venv/bin/calque", "session", "checkout", "--profile", "1g.24gb", "--ttl", "10m", "--wait", "--json"]
done = subprocess.run(cmd, capture_output=True, text=True)
if done.returncode != 0:
    sys.exit(f"checkout exited {done.returncode}: {done.stderr}")
s = json.loads(done.stdout)
still = [p for p in sys.argv[2:] if running(p)]
print(json.dumps({"slice": s["slice_id"], "id": s["id"], "running": still}), flush=True)
"""


def _wait_for_line(f: Fleet, path: str, want: str, timeout: float = HANG_S) -> str:
    deadline = time.monotonic() + timeout
    while want not in (out := f.ssh(MIG, f"cat {path} 2>/dev/null || true").stdout):
        assert time.monotonic() < deadline, f"{path} never said {want!r} (a hang): {out!r}"
        time.sleep(0.2)
    return out


def _running(f: Fleet, pattern: str) -> list[str]:
    """Pids whose command line matches ``pattern`` (bracket one letter, so that the shell running
    pgrep, whose command line holds the pattern itself, does not match)."""
    return f.ssh(MIG, f"pgrep -f '{pattern}' || true").stdout.split()


def test_a_slice_is_handed_over_only_after_its_last_holder_lost_every_descriptor(estate: Estate) -> None:
    f = estate.fleet
    a = json.loads(estate.as_user("alice", "calque session checkout --profile 1g.24gb --ttl 1h --json").stdout)
    # Carol holds every other free 1g.24gb slice here, so the queue can give Bob only Alice's.
    others: list[str] = []
    for _ in range(8):  # a host has at most a handful of them
        c = estate.as_user("carol", "calque session checkout --profile 1g.24gb --ttl 1h --json", check=False)
        if c.returncode != 0:
            break
        others.append(json.loads(c.stdout)["id"])
    assert c.returncode == 5, c.stderr  # nothing free: every 1g.24gb slice of the host is held
    node = estate.nodes(a["slice_id"])[0]
    f.ssh(MIG, "cat > /tmp/hold.py && chmod 644 /tmp/hold.py", input=HOLD)
    f.ssh(MIG, "cat > /tmp/take.py && chmod 644 /tmp/take.py", input=TAKE_OVER)
    # Alice keeps the node open from a process of her login, outside her session (no cgroup ends it).
    estate.as_user("alice", f"nohup python3 /tmp/hold.py {node} >/tmp/hold.out 2>&1 </dev/null &")
    _wait_for_line(f, "/tmp/hold.out", "holding")
    (keeper,) = _running(f, "[h]old.py")
    estate.as_user(
        "bob",
        f"nohup /opt/calque/venv/bin/python /tmp/take.py {a['slice_id']} {keeper} >/tmp/take.out 2>&1 </dev/null &",
    )
    _wait_for_line(f, "/tmp/take.out", "ready")
    estate.as_user("alice", "calque session checkin")
    got = json.loads(_wait_for_line(f, "/tmp/take.out", "running").splitlines()[-1])
    assert got["slice"] == a["slice_id"], got  # Bob got her slice within moments of her check-in
    assert got["running"] == [], "Alice's process still held the slice's node when Bob was given it"
    assert estate.can_read("bob", node) and not estate.can_read("alice", node)
    estate.as_user("bob", f"calque session checkin {got['id']}")
    for sid in others:
        estate.as_user("carol", f"calque session checkin {sid}")


def test_a_session_process_cannot_leave_its_scope_through_the_user_manager(estate: Estate) -> None:
    f = estate.fleet
    uid = f.ssh(MIG, "id -u alice").stdout.strip()
    # Alice's own systemd manager and its bus, as a lingering (or desktop) login has them.
    if f.ssh(MIG, "loginctl enable-linger alice", check=False).returncode != 0:
        f.ssh(MIG, f"systemctl start user@{uid}.service")
    until(
        lambda: f.ssh(MIG, f"test -S /run/user/{uid}/bus", check=False).returncode == 0,
        "alice's user manager has a bus",
        every=0.2,
    )
    s = json.loads(estate.as_user("alice", "calque session checkout --profile 1g.24gb --ttl 1h --json").stdout)
    bus = f"XDG_RUNTIME_DIR=/run/user/{uid} DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/{uid}/bus"
    # From inside the session: one child leaves through `systemd-run --user --scope`, another is moved
    # by AttachProcessesToUnit on her user bus into a unit of her own user manager (started by it,
    # not from the session: a way out that never was in the session, and keeps running).
    attach = (
        "busctl --user call org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager "
        "AttachProcessesToUnit ssau"
    )
    job = (
        f"export {bus}; "
        "systemd-run --user --unit=esc-hold -p Delegate=yes sleep 912 >/tmp/esc0.out 2>&1; "
        "systemd-run --user --scope --unit=esc-scope sleep 911 >/tmp/esc1.out 2>&1 & "
        "sleep 913 & victim=$!; sleep 0.5; "
        # AttachProcessesToUnit into the unit's own cgroup, else into a sub-cgroup she makes in it (hers:
        # the unit is delegated to her)
        f'{attach} esc-hold.service "" 1 $victim >/tmp/esc2.out 2>&1 || '
        "{ cg=$(systemctl --user show -p ControlGroup --value esc-hold.service); "
        "mkdir -p /sys/fs/cgroup/unified$cg/escaped /sys/fs/cgroup$cg/escaped 2>>/tmp/esc2.out; "
        f"{attach} esc-hold.service /escaped 1 $victim >>/tmp/esc2.out 2>&1; }}; "
        "echo rc=$? >>/tmp/esc2.out; "
        "exec sleep 914"
    )
    estate.as_user("alice", f"nohup calque session run -- bash -c '{job}' >/tmp/esc.out 2>&1 </dev/null &")
    try:
        said = _wait_for_line(f, "/tmp/esc2.out", "rc=")
        assert "rc=0" in said, f"the user bus refused the move (the path was not tried): {said}"
        until(
            lambda: not _running(f, "^(/usr/bin/)?sleep 91[13]"),
            "the daemon ends each process that left the session's scope",
            every=0.2,
        )
        # Both ways out were taken (the moved child, and systemd-run in its own scope: ended there, maybe
        # before it ran sleep 911), and each process that left was ended by the daemon, which says so.
        events = [json.loads(x) for x in f.ssh(MIG, "cat /var/log/calque/session-audit.jsonl").stdout.splitlines()]
        left = [p for e in events if e["event"] == "left_scope" and e["session"] == s["id"] for p in e["pids"]]
        why = f.ssh(MIG, "cat /tmp/esc1.out /tmp/esc2.out; journalctl --no-pager -n 40 -u calque-session", check=False)
        assert len(left) >= 2, f"left_scope pids {left}: {why.stdout}"
        assert _running(f, "^(/usr/bin/)?sleep 91[4]") and _running(
            f, "^(/usr/bin/)?sleep 91[2]"
        )  # the rest of the job, and the other door
        estate.as_user("alice", "calque session checkin")
        until(
            lambda: not _running(f, "^(/usr/bin/)?sleep 91[4]"),
            "the session's own work ends at its check-in",
            every=0.2,
        )
        assert _running(
            f, "^(/usr/bin/)?sleep 91[2]"
        )  # started by her manager, never in the session: it keeps running...
        assert not any(estate.can_read("alice", n) for n in estate.nodes(s["slice_id"]))  # ...without the slice
    finally:
        f.ssh(MIG, "pkill -u alice -f 'sleep 91[1-4]' || true; loginctl disable-linger alice || true", check=False)


def test_concurrent_runs_join_one_session_scope(estate: Estate) -> None:
    f = estate.fleet
    s = json.loads(estate.as_user("alice", "calque session checkout --profile 1g.24gb --ttl 1h --json").stdout)
    scope = f"calque-{s['id']}.scope"
    # Three runs started together as the session's first work: each is adopted, into the one scope.
    estate.as_user(
        "alice",
        "for i in 1 2 3; do nohup calque session run -- sleep 93$i >/tmp/run$i.out 2>&1 </dev/null & done",
    )
    deadline = time.monotonic() + HANG_S
    while len(_running(f, "^(/usr/bin/)?sleep 93[123]")) < 3:
        outs = f.ssh(MIG, "cat /tmp/run1.out /tmp/run2.out /tmp/run3.out 2>/dev/null || true").stdout
        assert "refused" not in outs, outs
        assert time.monotonic() < deadline, f"not every run started: {outs}"
        time.sleep(0.2)
    for pid in _running(f, "^(/usr/bin/)?sleep 93[123]"):  # each in the session's scope, as the kernel says
        where = f.ssh(MIG, f"sed -n 's/^0:://p' /proc/{pid}/cgroup").stdout.strip()
        assert where.endswith(f"/calque.slice/{scope}"), f"pid {pid} is in {where}, not {scope}"
    estate.as_user("alice", "calque session checkin")
    until(
        lambda: not _running(f, "^(/usr/bin/)?sleep 93[123]"), "the runs of a checked-in session end with it", every=0.2
    )


def test_logrotate_rotates_the_audit_trail_and_the_daemon_follows(estate: Estate) -> None:
    f = estate.fleet
    audit = "/var/log/calque/session-audit.jsonl"
    # The real logrotate with the role's /etc/logrotate.d/calque-session (forced: weekly is not due).
    r = f.ssh(MIG, "logrotate --force --verbose /etc/logrotate.d/calque-session 2>&1", check=False)
    assert r.returncode == 0, r.stdout
    assert f.ssh(MIG, f"test -s {audit}.1 && ! test -e {audit} && echo rotated").stdout.strip() == "rotated"
    # nocreate: the daemon makes the new file at its next event, root's and private, with that event.
    s = json.loads(estate.as_user("bob", "calque session checkout --profile 1g.24gb --ttl 1h --json").stdout)
    estate.as_user("bob", "calque session checkin")
    assert f.ssh(MIG, f"stat -c '%U %a' {audit}").stdout.strip() == "root 600"
    events = [json.loads(line) for line in f.ssh(MIG, f"cat {audit}").stdout.splitlines()]
    assert [e["event"] for e in events if e.get("session") == s["id"]][:1] == ["checkout"]
    assert not estate.can_read("bob", audit)


def test_mps_group_without_consent_is_refused_before_any_change(estate: Estate) -> None:
    f = estate.fleet
    units = "systemctl list-units 'calque-mps*' --all --no-legend --plain"
    before = f.ssh(MPS, units).stdout
    r = estate.site("no-consent", "--limit", MPS, "-e", json.dumps({CONSENT: False}))
    assert r.returncode != 0
    assert CONSENT in r.stdout
    assert recap(r.stdout)[MPS]["changed"] == 0 and recap(r.stdout)[MPS]["failed"] == 1
    assert f.ssh(MPS, units).stdout == before


# What site.yml must leave alone when it refuses: the files the roles write and the units they install.
WRITTEN = "sha256sum /etc/calque/* /etc/systemd/system/calque-* 2>/dev/null | sort"
RTX_PAIRS = {
    "calque_gpu_layout_mig_configs": {
        "teaching-small": [
            {
                "device-filter": "RTX-PRO-6000-Blackwell-Server-Edition",
                "devices": "all",
                "mig-enabled": True,
                "mig-devices": {"2g.48gb": 2},
            }
        ]
    }
}


def test_preflight_refuses_misspelled_and_invalid_variables_before_any_host_changes(estate: Estate) -> None:
    f = estate.fleet
    before = {h: f.ssh(h, WRITTEN).stdout for h in (MIG, H100, MPS)}
    bad = estate.inventory / "host_vars" / f"{MIG}.yml"
    kept = bad.read_text() if bad.exists() else None  # the estate's own host_vars, put back after
    bad.write_text(
        "calque_session_service_max_totl_ttl: 3h\n"
        "calque_session_service_default_ttl: 2hours\n"
        "calque_session_service_settings: {notice_befor: 60}\n"
        "calque_gpu_layout_force: maybe\n"
    )
    try:
        for mode in ((), ("--check", "--diff")):
            r = estate.site("preflight" + "-check" * bool(mode), *mode)
            assert r.returncode != 0, r.stdout[-4000:]
            said = r.stdout
            assert "did you mean calque_session_service_max_total_ttl?" in said
            assert "calque_session_service_default_ttl (set in " in said and "'2hours' is not a duration" in said
            assert "calque_session_service_settings.notice_befor" in said and "did you mean notice_before?" in said
            assert "calque_gpu_layout_force" in said and "not a valid boolean" in said
            assert f"host_vars/{MIG}.yml" in said
            totals = recap(said)
            assert set(totals) == set(ALL) and all(t["changed"] == 0 for t in totals.values()), totals
            assert "PLAY [GPU hosts" not in said  # no later play started on any host
    finally:
        if kept is None:
            bad.unlink()
        else:
            bad.write_text(kept)
    assert {h: f.ssh(h, WRITTEN).stdout for h in (MIG, H100, MPS)} == before


def _registry_live(f: Fleet) -> list[tuple[str, str]]:
    """The registry's live sessions and their MIG devices (read by the test on the host: the daemon's own
    list shows present slices only, so it cannot show a session left on a vanished one)."""
    code = (
        "import json, sqlite3; db = sqlite3.connect('file:/var/lib/calque/sessions.db?mode=ro', uri=True); "
        "print(json.dumps(db.execute(\"SELECT id, json_extract(slice_json, '$.mig_uuid') FROM sessions "
        'WHERE ended_at IS NULL").fetchall()))'
    )
    return [tuple(x) for x in json.loads(f.ssh(MIG, f"/opt/calque/venv/bin/python -c {shlex.quote(code)}").stdout)]


def test_a_layout_change_over_a_held_slice_warns_refuses_and_with_force_ends_the_session_first(
    estate: Estate,
) -> None:
    f = estate.fleet
    held = json.loads(estate.as_user("alice", "calque session checkout --profile 1g.24gb --ttl 1h --json").stdout)
    layout = json.loads(f.ssh(MIG, "calque gpu mig show --json").stdout)
    written = f.ssh(MIG, WRITTEN).stdout
    pairs = json.dumps(RTX_PAIRS)
    only_layout = ("--limit", MIG, "--tags", "gpu_layout_mig", "-e", pairs)

    # check mode: a warning naming the holder, nothing predicted to change
    checked = estate.site("held-check", *only_layout, "--check", "--diff")
    assert checked.returncode == 0, checked.stdout[-4000:]
    assert "the real run will be refused" in checked.stdout and "calque_gpu_layout_force" in checked.stdout
    assert "held by alice" in checked.stdout and held["id"] in checked.stdout
    assert recap(checked.stdout)[MIG]["changed"] == 0

    # the real run refuses, every file and slice as it was, alice's session live
    refused = estate.site("held-refused", *only_layout)
    assert refused.returncode != 0
    assert "held by alice" in refused.stdout and "calque_gpu_layout_force" in refused.stdout
    assert "Nothing was changed" in refused.stdout
    assert recap(refused.stdout)[MIG]["changed"] == 0 and recap(refused.stdout)[MIG]["failed"] == 1
    assert f.ssh(MIG, WRITTEN).stdout == written
    assert json.loads(f.ssh(MIG, "calque gpu mig show --json").stdout) == layout
    assert [s["id"] for s in json.loads(estate.as_user("alice", "calque session status --json").stdout)] == [held["id"]]

    # force: the session is ended first (reason layout), then the slices go; none is left on a missing device
    forced = estate.site("held-forced", *only_layout, "-e", '{"calque_gpu_layout_force": true}')
    assert forced.returncode == 0, forced.stdout[-4000:]
    assert json.loads(estate.as_user("alice", "calque session status --json").stdout) == []
    now = json.loads(f.ssh(MIG, "calque gpu mig show --json").stdout)["gpus"][0]["layout"]["instances"]
    assert [i.split("@")[0] for i in now] == ["2g.48gb"] * 2
    devices = {
        d["uuid"] for g in json.loads(f.ssh(MIG, "calque gpu info --json").stdout)["gpus"] for d in g["mig_devices"]
    }
    assert all(uuid in devices for _sid, uuid in _registry_live(f))
    events = [json.loads(line) for line in f.ssh(MIG, "cat /var/log/calque/session-audit.jsonl*").stdout.splitlines()]
    assert [e["reason"] for e in events if e.get("session") == held["id"] and e["event"] == "release"] == [
        "released: layout"
    ]

    # back to the inventory's layout (nothing held now)
    back = estate.site("held-back", "--limit", MIG, "--tags", "gpu_layout_mig")
    assert back.returncode == 0, back.stdout[-4000:]
    again = json.loads(f.ssh(MIG, "calque gpu mig show --json").stdout)["gpus"]
    assert [g["layout"] for g in again] == [g["layout"] for g in layout["gpus"]]
