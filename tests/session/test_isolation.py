"""A session's access ends with it: its cgroup, every descriptor on its nodes, its ACLs, its pipe directory.

Attacks from issue 12, as created Unix users against a real daemon: a retained node descriptor, a
holder widening her node's mode, a process left running after check-in, a stray opener of a free
slice's node, an MPS pipe directory open to everyone, notices to a terminal the holder does not own.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from calque.session.daemon.cgroup import cgroup2_mount
from calque.session.daemon.isolation import acl_users
from support.waits import HANG_S

from .conftest import CLI, Host, User, as_user, wait_for
from .institution import free_port, make_host

pytestmark = pytest.mark.slow

# Sleeps past any wait of the tests (HANG_S): only a kill ends it.
HOLD = "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); print('holding', flush=True); time.sleep(3600)"


def _nodes(host: Host, uuid: str) -> list[Path]:
    mig = next(m for m in host.migs if m.uuid == uuid)
    return [Path(p) for p in host.sim.capability_devices(mig)]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _hold(user: User, node: Path) -> subprocess.Popen[str]:
    """``user``'s process holding ``node`` open (opened while ``user`` may), outside any session cgroup."""
    p = subprocess.Popen(as_user(user, ["/usr/bin/python3", "-c", HOLD, str(node)]), stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "holding"
    return p


@pytest.fixture
def cgroup_parent() -> Iterator[Path]:
    """A cgroup v2 directory of this test's own (skips where cgroup v2 is absent or read-only)."""
    mount = cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy on this machine")
    parent = mount / f"calque-test-{secrets.token_hex(4)}"
    try:
        parent.mkdir()
    except OSError as exc:
        pytest.skip(f"cgroup v2 at {mount} is not writable here: {exc}")
    yield parent
    for child in [p for p in parent.iterdir() if p.is_dir()]:
        try:
            (child / "cgroup.kill").write_text("1")
            wait_for(lambda c=child: not (c / "cgroup.procs").read_text().split())  # type: ignore[misc]
            child.rmdir()
        except FileNotFoundError:
            continue  # the daemon removed it meanwhile, as a session's end does (a full run once saw it go)
    parent.rmdir()


def test_retained_node_descriptor_dies_with_the_session(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob = make_user(), make_user()
    # The periodic walk of every node (reassert_every) is an hour off: only the session's end (the
    # guard's walk of a newly free slice's opened nodes, the next tick) can end the keeper.
    host.start(reassert_every=3600)
    s = json.loads(host.cli(alice, "session", "checkout", "--json", check=True).stdout)
    node = _nodes(host, s["slice_id"])[0]
    keeper = _hold(alice, node)  # eval-mode work: not in the session's cgroup
    try:
        host.cli(alice, "session", "checkin", s["id"], check=True)
        assert wait_for(lambda: _gone(keeper.pid)), "the descriptor outlived the session"
        assert keeper.wait(HANG_S) == -signal.SIGKILL
        assert host.run_as(alice, ["/usr/bin/test", "-r", str(node)]).returncode != 0
        assert host.run_as(bob, ["/usr/bin/test", "-r", str(node)]).returncode != 0
    finally:
        if keeper.poll() is None:
            keeper.kill()
            keeper.wait()


# Bob, as himself: waits for the slice to be free, checks out at once (no guard tick between), and
# says, the moment his checkout has answered, which of the given pids still run.
TAKE_OVER = (
    f"HANG_S = {HANG_S!r}\n"
    + """
import json, sys, time
from pathlib import Path
from calque.models.session import CheckoutArgs
from calque.session.client import SessionClient
def running(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
c = SessionClient(Path(sys.argv[1]))
print("ready", flush=True)
deadline = time.monotonic() + HANG_S
while time.monotonic() < deadline and any(st.busy for st in c.list_slices() if st.slice.id == sys.argv[2]):
    pass
s = c.checkout(CheckoutArgs(ttl="10m"))
print(json.dumps({"slice": s.slice_id, "id": s.id, "running": [p for p in sys.argv[3:] if running(p)]}))
"""
)


def test_a_slice_is_handed_over_only_after_its_last_holder_lost_every_descriptor(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice, bob = make_user(), make_user()
    host.start()
    s = json.loads(host.cli(alice, "session", "checkout", "--json", check=True).stdout)
    node = _nodes(host, s["slice_id"])[0]
    keepers = [_hold(alice, node) for _ in range(3)]  # outside her session, where no cgroup ends them
    env = {**host.env, "CALQUE_SESSION_SOCKET": str(host.socket)}
    args = [str(host.socket), s["slice_id"], *(str(k.pid) for k in keepers)]
    taker = subprocess.Popen(
        as_user(bob, [*host.python, "-c", TAKE_OVER, *args]), env=env, cwd=host.dir, stdout=subprocess.PIPE, text=True
    )
    try:
        assert taker.stdout is not None and taker.stdout.readline().strip() == "ready"
        host.cli(alice, "session", "checkin", s["id"], check=True)
        out, _ = taker.communicate(timeout=2 * HANG_S)  # beyond its own wait (HANG_S) for the slice
        got = json.loads(out)
        assert got["slice"] == s["slice_id"]  # Bob got her slice within milliseconds of her check-in
        assert got["running"] == [], "Alice's processes still held the slice's node when Bob was given it"
        assert all(k.wait(HANG_S) == -signal.SIGKILL for k in keepers)
        assert host.run_as(bob, ["/usr/bin/test", "-r", str(node)]).returncode == 0
        # Bob's own descriptors are his to keep while he holds it
        mine = _hold(bob, node)
        time.sleep(0.6)
        assert mine.poll() is None
        mine.kill()
        mine.wait()
    finally:
        for p in [*keepers, taker]:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_holder_cannot_widen_access_to_her_nodes(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob = make_user(), make_user()
    host.start()
    s = json.loads(host.cli(alice, "session", "checkout", "--json", check=True).stdout)
    for node in _nodes(host, s["slice_id"]):
        assert node.stat().st_uid == 0 and acl_users(node) == {alice.uid: 4}
        # Only the owner may chmod or change the ACL, and the owner is root.
        assert host.run_as(alice, ["/bin/chmod", "0444", str(node)]).returncode != 0
        assert host.run_as(alice, ["/usr/bin/setfacl", "-m", f"u:{bob.uid}:r", str(node)]).returncode != 0
        assert host.run_as(bob, ["/usr/bin/test", "-r", str(node)]).returncode != 0
        assert host.run_as(alice, ["/usr/bin/test", "-r", str(node)]).returncode == 0


def test_a_node_descriptor_handed_to_another_user_is_ended(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob = make_user(), make_user()
    host.start(reassert_every=0.5)
    s = json.loads(host.cli(alice, "session", "checkout", "--json", check=True).stdout)
    held = _nodes(host, s["slice_id"])[0]
    free = _nodes(host, next(m.uuid for m in host.migs if m.uuid != s["slice_id"]))[0]
    mine = _hold(alice, held)  # Alice's own use of her slice: left alone
    # Descriptors Bob never could have opened, handed to his process (as SCM_RIGHTS or inheritance
    # would): one of Alice's live slice, one of a free slice.
    fds = [os.open(held, os.O_RDONLY), os.open(free, os.O_RDONLY)]
    idle = "import time; print('holding', flush=True); time.sleep(120)"
    bobs = subprocess.Popen(
        as_user(bob, ["/usr/bin/python3", "-c", idle]), pass_fds=fds, stdout=subprocess.PIPE, text=True
    )
    for fd in fds:
        os.close(fd)
    try:
        assert bobs.wait(HANG_S) == -signal.SIGKILL  # may be before it even printed "holding"
        time.sleep(1.0)  # two more re-checks
        assert mine.poll() is None, "the holder's own process on her own node was ended"
    finally:
        for p in (mine, bobs):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_node_the_driver_creates_or_resets_is_closed_at_once(host: Host, make_user: Callable[..., User]) -> None:
    alice = make_user()
    host.start(reassert_every=3600)  # the timer's re-check is an hour off: only the watcher can act
    s = json.loads(host.cli(alice, "session", "checkout", "--json", check=True).stdout)
    caps = host.dir / "root/dev/nvidia-caps"
    new = caps / "nvidia-cap999"
    os.close(os.open(new, os.O_CREAT | os.O_WRONLY, 0o444))  # as the driver makes a new MIG device's node
    free = _nodes(host, next(m.uuid for m in host.migs if m.uuid != s["slice_id"]))[0]
    held = _nodes(host, s["slice_id"])[0]
    for n in (free, held):  # as the driver resets modes (DeviceFileModify: 1) when a device is opened
        os.chmod(n, 0o444)
        os.close(os.open(n, os.O_RDONLY))
    assert wait_for(lambda: all(n.stat().st_mode & 0o777 == 0o400 for n in (new, free)))
    assert wait_for(lambda: acl_users(held) == {alice.uid: 4} and held.stat().st_mode & 0o007 == 0)


def test_session_run_work_lives_in_the_session_cgroup_and_ends_with_it(
    host: Host, make_user: Callable[..., User], cgroup_parent: Path
) -> None:
    alice, bob = make_user(), make_user()
    host.start(cgroup_parent=str(cgroup_parent), cgroups="direct")
    s = json.loads(host.cli(alice, "session", "checkout", "--json", check=True).stdout)
    out = host.dir / "run.out"
    out.touch()
    out.chmod(0o666)
    script = f'echo "$CALQUE_SESSION_ID $CUDA_VISIBLE_DEVICES" > {out}; sleep 3600 & exec sleep 3601'
    env = {**host.env, "CALQUE_SESSION_SOCKET": str(host.socket)}
    cmd = [*host.python, "-c", CLI, "session", "run", "--", "/bin/sh", "-c", script]
    work = subprocess.Popen(as_user(alice, cmd), env=env, cwd=host.dir)
    cg = cgroup_parent / s["id"]
    try:
        assert wait_for(lambda: cg.is_dir() and len((cg / "cgroup.procs").read_text().split()) == 2)
        assert out.read_text().split() == [s["id"], s["slice_id"]]
        pids = [int(p) for p in (cg / "cgroup.procs").read_text().split()]
        assert work.pid in pids  # the CLI process itself was adopted, then exec'd the command
        # Bob cannot run in Alice's session.
        res = host.cli(bob, "session", "run", "--session", s["id"], "--", "/bin/true")
        assert res.returncode == 4 and "not yours" in res.stderr, res.stderr
        host.cli(alice, "session", "checkin", s["id"], check=True)
        # The sleeps outlast any wait here: only the session's end (its cgroup killed) ends them.
        assert wait_for(lambda: all(_gone(p) for p in pids)), "the session's work outlived its check-in"
        assert work.wait(HANG_S) == -signal.SIGKILL
        assert wait_for(lambda: not cg.exists())
    finally:
        if work.poll() is None:
            work.kill()
            work.wait()


def test_a_second_daemon_under_the_same_cgroup_parent_leaves_this_ones_sessions_alone(
    host: Host, make_user: Callable[..., User], cgroup_parent: Path
) -> None:
    # Two daemons, one cgroup parent (two services on a host, or a test run's daemons side by side):
    # the other's sweep once killed every session cgroup its own registry did not list as live.
    alice = make_user()
    other = make_host(host.dir, "other", 1, alice, free_port())
    host.start(cgroup_parent=str(cgroup_parent), cgroups="direct")
    other.start(mps=False, cgroup_parent=str(cgroup_parent), cgroups="direct")
    s = json.loads(host.cli(alice, "session", "checkout", "--json", check=True).stdout)
    env = {**host.env, "CALQUE_SESSION_SOCKET": str(host.socket)}
    cmd = [*host.python, "-c", CLI, "session", "run", "--", "/bin/sleep", "300"]
    work = subprocess.Popen(as_user(alice, cmd), env=env, cwd=host.dir)
    cg = cgroup_parent / s["id"]
    try:
        assert wait_for(lambda: cg.is_dir() and (cg / "cgroup.procs").read_text().split() == [str(work.pid)])
        time.sleep(1.5)  # six of the other daemon's ticks (0.25 s apart)
        assert work.poll() is None and cg.is_dir()
        foreign = f"cgroup of session {s['id']} is not one of this daemon's sessions; leaving it"
        assert (other.dir / "daemon.log").read_text().count(foreign) == 1  # named once, not every tick
        host.cli(alice, "session", "checkin", s["id"], check=True)
        assert work.wait(HANG_S) == -signal.SIGKILL  # its own daemon still ends it
    finally:
        other.stop()
        if work.poll() is None:
            work.kill()
            work.wait()


def test_concurrent_runs_join_one_session_scope(
    host: Host, make_user: Callable[..., User], cgroup_parent: Path
) -> None:
    alice = make_user()
    host.start(cgroup_parent=str(cgroup_parent), cgroups="direct", processes=2)
    s = json.loads(host.cli(alice, "session", "checkout", "--json", check=True).stdout)
    env = {**host.env, "CALQUE_SESSION_SOCKET": str(host.socket)}
    cmd = [*host.python, "-c", CLI, "session", "run", "--", "/bin/sleep", "300"]
    # Two runs started together as the session's first work: both are adopted, into the one cgroup.
    works = [subprocess.Popen(as_user(alice, cmd), env=env, cwd=host.dir, stderr=subprocess.PIPE) for _ in range(2)]
    cg = cgroup_parent / s["id"]
    try:
        assert wait_for(lambda: cg.is_dir() and len((cg / "cgroup.procs").read_text().split()) == 2), [
            w.poll() for w in works
        ]
        assert sorted(int(p) for p in (cg / "cgroup.procs").read_text().split()) == sorted(w.pid for w in works)
        assert [w.poll() for w in works] == [None, None]
        host.cli(alice, "session", "checkin", s["id"], check=True)
        assert [w.wait(HANG_S) for w in works] == [-signal.SIGKILL, -signal.SIGKILL]
    finally:
        for w in works:
            if w.poll() is None:
                w.kill()
                w.wait()


def test_work_moved_out_of_its_session_cgroup_is_ended(
    host: Host, make_user: Callable[..., User], cgroup_parent: Path
) -> None:
    alice = make_user()
    host.start(cgroup_parent=str(cgroup_parent), cgroups="direct")
    s = json.loads(host.cli(alice, "session", "checkout", "--json", check=True).stdout)
    env = {**host.env, "CALQUE_SESSION_SOCKET": str(host.socket)}
    cmd = [*host.python, "-c", CLI, "session", "run", "--", "/bin/sh", "-c", "sleep 300 & exec sleep 301"]
    work = subprocess.Popen(as_user(alice, cmd), env=env, cwd=host.dir)
    cg = cgroup_parent / s["id"]
    try:
        assert wait_for(lambda: cg.is_dir() and len((cg / "cgroup.procs").read_text().split()) == 2)
        (child,) = [int(p) for p in (cg / "cgroup.procs").read_text().split() if int(p) != work.pid]
        time.sleep(0.6)  # the main process has seen both in the session's cgroup
        # What systemd does when her user manager asks it to (systemd-run --user --scope, or
        # AttachProcessesToUnit): the process moved into a cgroup of hers outside the session.
        elsewhere = cgroup_parent / "user-manager"
        elsewhere.mkdir()
        (elsewhere / "cgroup.procs").write_text(f"{child}\n")
        assert wait_for(lambda: _gone(child)), "a process that left its session's cgroup still runs"
        assert work.poll() is None  # the rest of the session's work runs on
        assert [e["pids"] for e in host.audit_events() if e["event"] == "left_scope"] == [[child]]
        host.cli(alice, "session", "checkin", s["id"], check=True)
        assert work.wait(HANG_S) == -signal.SIGKILL
    finally:
        if work.poll() is None:
            work.kill()
            work.wait()


def test_expiry_ends_the_session_cgroup_after_sigterm(
    host: Host, make_user: Callable[..., User], cgroup_parent: Path
) -> None:
    alice = make_user()
    host.start(cgroup_parent=str(cgroup_parent), cgroups="direct", kill_grace=0.3)
    s = json.loads(host.cli(alice, "session", "checkout", "--ttl", "2s", "--json", check=True).stdout)
    env = {**host.env, "CALQUE_SESSION_SOCKET": str(host.socket)}
    # A shell that ignores SIGTERM: the grace passes, then the cgroup is killed.
    cmd = [*host.python, "-c", CLI, "session", "run", "--", "/bin/sh", "-c", "trap '' TERM; sleep 300; sleep 1"]
    work = subprocess.Popen(as_user(alice, cmd), env=env, cwd=host.dir)
    try:
        assert work.wait(HANG_S) == -signal.SIGKILL
        assert wait_for(lambda: not (cgroup_parent / s["id"]).exists())
        assert [e["event"] for e in host.audit_events() if e["session"] == s["id"]][-1] == "expiry"
    finally:
        if work.poll() is None:
            work.kill()
            work.wait()


def test_mps_pipe_directory_opens_to_the_slot_holder_alone(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob = make_user(), make_user()
    pipe = host.mps_pipe(1)
    host.start(reassert_every=0.3)  # the GPU's control daemon (the stand-in) listens on pipe/control
    assert wait_for(lambda: pipe.stat().st_mode & 0o777 == 0o700)  # no slot held: root's alone
    s = json.loads(
        host.cli(
            alice, "session", "checkout", "--mps", "--i-understand-shared-gpu-has-no-isolation", "--json", check=True
        ).stdout
    )
    assert s["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert acl_users(pipe) == {alice.uid: 7}
    assert host.run_as(alice, ["/usr/bin/test", "-e", str(pipe / "control")]).returncode == 0
    assert host.run_as(bob, ["/usr/bin/test", "-e", str(pipe / "control")]).returncode != 0
    host.cli(alice, "session", "checkin", s["id"], check=True)
    assert wait_for(lambda: acl_users(pipe) == {})
    assert host.run_as(alice, ["/usr/bin/test", "-e", str(pipe / "control")]).returncode != 0


def test_notices_reach_only_terminals_the_holder_owns(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob = make_user(), make_user()
    host.start(notice_before=2.0)
    mine_m, mine_s = os.openpty()
    os.chown(os.ttyname(mine_s), alice.uid, -1)
    theirs_m, theirs_s = os.openpty()
    os.chown(os.ttyname(theirs_s), bob.uid, -1)  # Bob's terminal, which Alice's process has open
    procs = [
        subprocess.Popen(as_user(alice, ["/bin/sleep", "60"]), stdin=tty, stdout=tty, stderr=tty)
        for tty in (mine_s, theirs_s)
    ]
    try:
        s = json.loads(host.cli(alice, "session", "checkout", "--ttl", "3s", "--json", check=True).stdout)
        assert wait_for(lambda: any(e["event"] == "notice" for e in host.audit_events()))
        for m in (mine_m, theirs_m):
            os.set_blocking(m, False)
        assert f"session {s['id']}" in os.read(mine_m, 65536).decode(errors="replace")
        with pytest.raises(BlockingIOError):
            os.read(theirs_m, 65536)
        notice = next(e for e in host.audit_events() if e["event"] == "notice")
        assert notice["terminals"] == 1
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for fd in (mine_m, mine_s, theirs_m, theirs_s):
            os.close(fd)


# Work in the session's cgroup that the GPU backend does not list: one exits a second after SIGTERM,
# the other ignores it. Each writes down when SIGTERM came and whether it left by itself.
TRAPPER = (
    "import signal, sys, time\n"
    "log = open(sys.argv[1], 'a', buffering=1)\n"
    "def on(sig, frame):\n"
    "    log.write(f'SIGTERM {time.time()}\\n')\n"
    "    if sys.argv[2] == 'slow-exit':\n"
    "        time.sleep(1.0)\n"
    "        log.write('exited\\n')\n"
    "        sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, on)\n"
    "log.write('started\\n')\n"
    "while True:\n"
    "    time.sleep(0.05)\n"
)


def test_expiry_gives_every_process_of_the_cgroup_kill_grace(
    host: Host, make_user: Callable[..., User], cgroup_parent: Path
) -> None:
    alice = make_user()
    grace = 3.0
    host.start(cgroup_parent=str(cgroup_parent), cgroups="direct", kill_grace=grace)
    script = host.dir / "trapper.py"
    script.write_text(TRAPPER)
    script.chmod(0o644)
    logs = {mode: host.dir / f"{mode}.log" for mode in ("slow-exit", "ignore-term")}
    for log in logs.values():
        log.touch()
        log.chmod(0o666)
    s = json.loads(host.cli(alice, "session", "checkout", "--ttl", "3s", "--json", check=True).stdout)
    env = {**host.env, "CALQUE_SESSION_SOCKET": str(host.socket)}
    run = [*host.python, "-c", CLI, "session", "run", "--", "/usr/bin/python3", str(script)]
    works = {
        mode: subprocess.Popen(as_user(alice, [*run, str(log), mode]), env=env, cwd=host.dir)
        for mode, log in logs.items()
    }
    try:
        assert wait_for(lambda: all("started" in log.read_text() for log in logs.values()))
        # The GPU backend lists neither: they are the session's only through its cgroup.
        assert not {p.pid for p in host.sim.processes()} & {w.pid for w in works.values()}
        slow, stubborn = works["slow-exit"], works["ignore-term"]
        assert slow.wait(HANG_S) == 0  # it left by itself, a second after SIGTERM: not SIGKILLed
        assert logs["slow-exit"].read_text().splitlines()[-1] == "exited"
        assert stubborn.wait(HANG_S) == -signal.SIGKILL
        killed_at = time.time()
        term_at = float(logs["ignore-term"].read_text().splitlines()[1].split()[1])
        assert killed_at - term_at >= grace - 0.2, f"SIGKILL {killed_at - term_at:.2f} s after SIGTERM"
        assert wait_for(lambda: not (cgroup_parent / s["id"]).exists())
        assert [e["event"] for e in host.audit_events() if e["session"] == s["id"]][-1] == "expiry"
    finally:
        for w in works.values():
            if w.poll() is None:
                w.kill()
                w.wait()
