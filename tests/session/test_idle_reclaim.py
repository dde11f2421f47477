"""Idle reclaim by measured utilisation, as real second users on a simulated host with a real daemon.

The slice's activity is what the simulator's driver reports (``SimGpu.set_load``, what ``calque gpu
sim load`` does); the holder's processes are real processes of that user, listed on the slice.

A session's idle clock starts at its checkout, so what a test sets up on a slice it does within the
first notice's lead, in this process (the processes to list there run before the checkout). When an
idle window ends is checked on the daemon's own clock (the registry's ``last_active``), never against
how soon the test saw it: that is a timing goal, for bench/.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from functools import partial
from typing import Any

import pytest
from support.waits import HANG_S

from .conftest import Host, User, as_user, wait_for

pytestmark = pytest.mark.slow


@contextmanager
def _running(user: User, **popen: Any) -> Iterator[subprocess.Popen[bytes]]:
    """A process of ``user`` (a notebook kernel, say), to list on a slice once it is checked out."""
    p = subprocess.Popen(as_user(user, ["/bin/sleep", "3600"]), **popen)
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


@contextmanager
def _on_slice(host: Host, user: User, slice_id: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process of ``user`` that the driver lists on the slice."""
    with _running(user) as p:
        host.sim.add_process(slice_id, p.pid, used_memory_mib=2048)
        yield p


def _checkout(host: Host, user: User) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(host.cli(user, "session", "checkout", "--ttl", "1h", "--json", check=True).stdout)
    return out


def _events(host: Host, sid: str, event: str) -> list[dict[str, Any]]:
    return [e for e in host.audit_events() if e["session"] == sid and e["event"] == event]


def _ended_at(host: Host, sid: str) -> float:
    (e,) = _events(host, sid, "idle")
    return datetime.fromisoformat(e["ts"]).timestamp()


def _idle_clock(host: Host, sid: str) -> float:
    """The session's idle clock as the daemon keeps it: when its slice was last seen active (its checkout
    if never), what its idle notice and end are counted from."""
    db = sqlite3.connect(host.dir / "state/sessions.db")
    try:
        (at,) = db.execute("SELECT last_active FROM sessions WHERE id=?", (sid,)).fetchone()
    finally:
        db.close()
    return float(at)


def _judged_active_after_for(host: Host, s: dict[str, Any], for_s: float) -> bool:
    """The daemon has seen the slice active later than ``for`` after the checkout: by then an idle one
    would have ended, so a session still held is one that was judged active, not one not judged yet."""
    return _idle_clock(host, s["id"]) > datetime.fromisoformat(s["created_at"]).timestamp() + for_s


def _usage_reason(host: Host, sid: str) -> str | None:
    db = sqlite3.connect(host.dir / "state/sessions.db")
    try:
        row = db.execute("SELECT end_reason FROM usage WHERE session_id=?", (sid,)).fetchone()
    finally:
        db.close()
    return None if row is None else str(row[0])


def _idle_metrics(host: Host) -> dict[str, float]:
    """``calque_session_idle_seconds`` per slice (and the policy's ``for`` as "reclaim"), as an admin scrapes them."""
    out: dict[str, float] = {}
    for line in host.cli(None, "session", "metrics", check=True).stdout.splitlines():
        if line.startswith("calque_session_idle_seconds{"):
            out[line.split('slice="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("calque_session_idle_reclaim_seconds "):
            out["reclaim"] = float(line.rsplit(" ", 1)[1])
    return out


def _status(host: Host, user: User) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = json.loads(host.cli(user, "session", "status", "--json", check=True).stdout)
    return got


def test_an_idle_slice_is_warned_then_ended_with_reason_idle_and_a_busy_one_never(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice, bob = make_user(), make_user()
    # memory_from: 4GiB: a bare CUDA context or a small model held while computing nothing is idle.
    host.start(idle={"below": "5%", "for": "4s", "warn": "2s", "memory_from": "4GiB"})
    master, slave = os.openpty()  # Alice's terminal: her process on the slice has it open
    os.chown(os.ttyname(slave), alice.uid, -1)
    try:
        with _running(alice, stdin=slave) as term, _running(bob) as bobs:
            idle = _checkout(host, alice)
            host.sim.add_process(idle["slice_id"], term.pid)
            host.sim.set_load(idle["slice_id"], 0.0, 3000)  # a notebook holding memory, running nothing
            busy = _checkout(host, bob)
            host.sim.add_process(busy["slice_id"], bobs.pid, used_memory_mib=2048)
            host.sim.set_load(busy["slice_id"], 85.0)
            assert wait_for(lambda: bool(_events(host, idle["id"], "idle_notice")))
            notice = datetime.fromisoformat(_events(host, idle["id"], "idle_notice")[0]["ts"]).timestamp()
            assert wait_for(lambda: bool(_events(host, idle["id"], "idle")))
            created = datetime.fromisoformat(idle["created_at"]).timestamp()
            ended = _ended_at(host, idle["id"])
            # Never active: its clock is its checkout. Warned at for - warn of idleness, ended at for, not before.
            assert _idle_clock(host, idle["id"]) == pytest.approx(created, abs=0.01)
            assert notice - created >= 2.0 - 0.01, notice - created
            assert ended - created >= 4.0 - 0.01, ended - created
            assert term.wait(HANG_S) != 0  # her process on the reclaimed slice was ended
            assert _usage_reason(host, idle["id"]) == "idle"
            os.set_blocking(master, False)
            seen = os.read(master, 65536).decode(errors="replace")
            assert "has been idle" in seen and idle["id"] in seen, seen
            time.sleep(1.0)
            assert [s["id"] for s in _status(host, bob)] == [busy["id"]]
            assert bobs.poll() is None
            assert _events(host, busy["id"], "idle_notice") == []
    finally:
        os.close(master)
        os.close(slave)


def test_activity_resets_the_idle_clock_and_extend_does_not(host: Host, make_user: Callable[..., User]) -> None:
    alice = make_user()
    # for: 15 s, room for the extend and the status below (commands, each seconds long on a loaded
    # machine) before the slice gets busy: the session must still be live then.
    # memory_from: null: the kernel's 2 GiB are not activity, only its engines are.
    host.start(idle={"below": "0.05", "for": "15s", "warn": "0s", "memory_from": None})
    with _running(alice) as kernel:
        s = _checkout(host, alice)
        host.sim.add_process(s["slice_id"], kernel.pid, used_memory_mib=2048)
        host.sim.set_load(s["slice_id"], 1.0)  # 1 %: below the threshold
        created = datetime.fromisoformat(s["created_at"]).timestamp()
        host.cli(alice, "session", "extend", "--by", "30m", check=True)
        (st,) = _status(host, alice)
        assert datetime.fromisoformat(st["active_at"]).timestamp() == pytest.approx(created, abs=0.01)
        assert datetime.fromisoformat(st["idle_ends_at"]).timestamp() == pytest.approx(created + 15, abs=0.01)
        host.sim.set_load(s["slice_id"], 60.0)  # it gets busy: the clock follows
        busy_from = time.time()
        assert wait_for(lambda: datetime.fromisoformat(_status(host, alice)[0]["active_at"]).timestamp() > busy_from)
        time.sleep(1.5)
        host.sim.set_load(s["slice_id"], 0.0)
        assert "IDLE" in host.cli(alice, "session", "status", check=True).stdout
        assert wait_for(lambda: bool(_events(host, s["id"], "idle")))
    ended = _ended_at(host, s["id"])
    clock = _idle_clock(host, s["id"])
    assert clock > busy_from  # the busy spell reset it: not ended at created + for
    assert ended - clock >= 15.0 - 0.01, ended - clock  # a whole `for` after the slice was last seen busy


def test_unknown_utilisation_and_exempt_groups_are_never_reclaimed(host: Host, make_user: Callable[..., User]) -> None:
    group = "cqexempt" + os.urandom(3).hex()
    carol, dave, erin = make_user([group]), make_user(), make_user()
    host.start(idle={"below": "5%", "for": "2s", "warn": "0s", "exempt_groups": [group], "memory_from": None})
    with _running(dave) as his, _running(erin) as hers:
        exempt = _checkout(host, carol)
        unknown = _checkout(host, dave)
        host.sim.add_process(unknown["slice_id"], his.pid, used_memory_mib=2048)
        idle = _checkout(host, erin)
        host.sim.add_process(idle["slice_id"], hers.pid, used_memory_mib=2048)
        # Dave's slice has a process and no activity reported (an A100 MIG device has no GPM);
        # Carol's has nothing on it at all, but her group is exempt; Erin's reports 0 %.
        host.sim.set_load(idle["slice_id"], 0.0)
        assert wait_for(lambda: bool(_events(host, idle["id"], "idle")))
        time.sleep(2.5)
        assert [x["id"] for x in _status(host, dave)] == [unknown["id"]]
        (mine,) = _status(host, carol)
        assert mine["id"] == exempt["id"] and mine["active_at"] is None
        assert "exempt" in host.cli(carol, "session", "status", check=True).stdout
        # The metrics measure every held slice, exempt or not: Carol's has been idle since her checkout.
        idle = _idle_metrics(host)
        assert idle["reclaim"] == 2.0
        assert idle[exempt["slice_id"]] >= 4.0 and unknown["slice_id"] in idle
        # Dave's unknown activity counts as activity: his clock has moved on since his checkout.
        (daves,) = _status(host, dave)
        assert datetime.fromisoformat(daves["active_at"]) > datetime.fromisoformat(unknown["created_at"]), daves
    assert _events(host, unknown["id"], "idle") == [] and _events(host, exempt["id"], "idle") == []


def test_a_session_idle_across_a_daemon_restart_gets_a_whole_idle_period_after_it(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice, bob = make_user(), make_user()
    policy = {"below": "5%", "for": "4s", "warn": "2s", "memory_from": None}
    host.start(idle=policy)
    with _running(alice) as mine, _running(bob) as bobs:
        s = _checkout(host, alice)
        host.sim.add_process(s["slice_id"], mine.pid, used_memory_mib=2048)
        host.sim.set_load(s["slice_id"], 0.0)
        busy = _checkout(host, bob)
        host.sim.add_process(busy["slice_id"], bobs.pid, used_memory_mib=2048)
        host.sim.set_load(busy["slice_id"], 80.0)
        assert wait_for(lambda: bool(_events(host, s["id"], "idle_notice")))
        host.kill9()  # no goodbye: what the slice does from here until the restart is unknown
        down_at = time.time()
        time.sleep(4.5)  # down longer than a whole `for`: by the old clock it is overdue
        restart = time.time()
        host.start(idle=policy)
        assert wait_for(lambda: bool(_events(host, s["id"], "idle")))
        # Ended a whole `for` after the restart, not at its first tick: the time down counted as active.
        assert [x["id"] for x in _status(host, bob)] == [busy["id"]]
    assert _events(host, busy["id"], "idle") == [] and _events(host, busy["id"], "idle_notice") == []
    ended = _ended_at(host, s["id"])
    clock = _idle_clock(host, s["id"])
    assert down_at < clock and restart <= clock, (down_at, restart, clock)  # started again at the restart
    assert ended - clock >= 4.0 - 0.01, ended - clock
    assert ended - restart >= 4.0 - 0.01, ended - restart
    notices = _events(host, s["id"], "idle_notice")
    assert len(notices) == 2, notices  # one before the kill, a fresh one before the end after the restart
    assert datetime.fromisoformat(notices[1]["ts"]).timestamp() > restart
    assert _usage_reason(host, s["id"]) == "idle"


def test_an_mps_client_with_no_per_process_sample_is_never_reclaimed(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice, bob = make_user(), make_user()
    host.start(idle={"below": "5%", "for": "2s", "warn": "0s", "memory_from": None})
    args = ["session", "checkout", "--mps", "--i-understand-shared-gpu-has-no-isolation", "--ttl", "1h", "--json"]
    # Two clients of hers, before the checkout (listed at once): the driver samples one, not the other.
    with _running(alice) as sampled, _running(alice) as unsampled, _running(bob) as his:
        s = json.loads(host.cli(alice, *args, check=True).stdout)
        gpu = next(g.uuid for g in host.sim.gpus() if g.index == s["gpu_index"])
        host.sim.add_process(gpu, sampled.pid)
        host.sim.add_process(gpu, unsampled.pid)
        host.sim.set_load(gpu, 0.0)  # the GPU as a whole reads idle
        host.sim.set_load(gpu, 0.0, pid=sampled.pid)
        # The yardstick: Bob's idle MIG slice, checked out after hers, is reclaimed.
        control = _checkout(host, bob)
        host.sim.add_process(control["slice_id"], his.pid)
        host.sim.set_load(control["slice_id"], 0.0)
        assert wait_for(lambda: bool(_events(host, control["id"], "idle")))
        # Judged active (its clock moves), never idle: the unsampled client's use is unknown, not 0 %.
        assert wait_for(partial(_judged_active_after_for, host, s, 2.0))
        assert [x["id"] for x in _status(host, alice)] == [s["id"]]
        assert unsampled.poll() is None and sampled.poll() is None
        assert _events(host, s["id"], "idle") == []
        host.sim.set_load(gpu, 0.0, pid=unsampled.pid)  # now sampled too, at 0 %: the slot is idle
        assert wait_for(lambda: bool(_events(host, s["id"], "idle")))
        assert unsampled.wait(HANG_S) != 0 and sampled.wait(HANG_S) != 0
    assert _usage_reason(host, s["id"]) == "idle"


def test_work_as_root_on_the_holders_slice_that_reads_busy_is_never_reclaimed(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice, carol, bob = make_user(), make_user(), make_user()
    host.start(idle={"below": "5%", "for": "2s", "warn": "0s"})
    # Root's processes (work run as root in a container), none of the holders' own on their slices.
    root_busy = subprocess.Popen(["/bin/sleep", "3600"])
    root_unread = subprocess.Popen(["/bin/sleep", "3600"])
    try:
        with _running(bob) as his:
            busy = _checkout(host, alice)
            host.sim.add_process(busy["slice_id"], root_busy.pid)
            host.sim.set_load(busy["slice_id"], 90.0)  # GPM reads the slice 90 % busy
            unread = _checkout(host, carol)
            host.sim.add_process(unread["slice_id"], root_unread.pid)  # no GPM (an A100): unknown
            control = _checkout(host, bob)
            host.sim.add_process(control["slice_id"], his.pid)
            host.sim.set_load(control["slice_id"], 0.0)
            assert wait_for(lambda: bool(_events(host, control["id"], "idle")))
            for s in (busy, unread):
                assert wait_for(partial(_judged_active_after_for, host, s, 2.0))
            assert [x["id"] for x in _status(host, alice)] == [busy["id"]]
            assert [x["id"] for x in _status(host, carol)] == [unread["id"]]
            assert root_busy.poll() is None and root_unread.poll() is None
    finally:
        for p in (root_busy, root_unread):
            p.kill()
            p.wait()
    assert _events(host, busy["id"], "idle") == [] and _events(host, unread["id"], "idle") == []


# A workload that writes down when each signal reached it, and exits on SIGTERM.
SIGNAL_LOG = textwrap.dedent(
    """
    import signal, sys, time
    log = open(sys.argv[1], "a", buffering=1)
    def on(sig, frame):
        log.write(f"{signal.Signals(sig).name} {time.time()}\\n")
        if sig == signal.SIGTERM:
            sys.exit(0)
    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGTERM, on)
    log.write("started\\n")
    while True:
        time.sleep(0.05)
    """
)


def test_the_checkpoint_signal_arrives_the_configured_lead_before_sigterm(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice = make_user()
    lead = 3.0
    host.start(
        idle={"below": "5%", "for": "6s", "warn": "0s", "memory_from": None, "checkpoint_signal": "SIGUSR1",
              "checkpoint_before": f"{lead:g}s"},
        kill_grace=5.0,
    )  # fmt: skip
    script, log = host.dir / "checkpointing.py", host.dir / "signals.log"
    script.write_text(SIGNAL_LOG)
    script.chmod(0o644)
    log.touch()
    log.chmod(0o666)
    master, slave = os.openpty()  # Alice's terminal
    os.chown(os.ttyname(slave), alice.uid, -1)
    work = subprocess.Popen(as_user(alice, ["/usr/bin/python3", str(script), str(log)]), stdin=slave)
    try:
        assert wait_for(lambda: "started" in log.read_text())
        s = _checkout(host, alice)
        host.sim.add_process(s["slice_id"], work.pid)
        host.sim.set_load(s["slice_id"], 0.0)
        assert wait_for(lambda: bool(_events(host, s["id"], "idle")))
        assert work.wait(HANG_S) == 0  # it saved its work on SIGUSR1 and left on SIGTERM
        os.set_blocking(master, False)
        seen = os.read(master, 65536).decode(errors="replace")
    finally:
        if work.poll() is None:
            work.kill()
        work.wait()
        os.close(master)
        os.close(slave)
    got = [line.split() for line in log.read_text().splitlines()[1:]]
    assert [name for name, _ in got] == ["SIGUSR1", "SIGTERM"], got
    usr1, term = (float(at) for _, at in got)
    # As the workload saw them: the checkpoint first, the lead between them (less only the signal's delivery).
    assert term - usr1 >= lead - 0.5, term - usr1
    (cp,) = _events(host, s["id"], "idle_checkpoint")
    (end,) = _events(host, s["id"], "idle")
    assert cp["signal"] == "SIGUSR1" and cp["pids"] == [work.pid], cp
    sent, sigterm = (datetime.fromisoformat(x).timestamp() for x in (end["checkpoint_at"], end["sigterm_at"]))
    # As the daemon's audit trail has them: the signal a whole lead before SIGTERM, and not before its time.
    assert sigterm - sent >= lead - 0.01, (sent, sigterm)
    created = datetime.fromisoformat(s["created_at"]).timestamp()
    assert sent - created >= 6.0 - lead - 0.01 and sigterm - created >= 6.0 - 0.01
    assert end["terminated"] == [work.pid] and "engine activity 0%" in end["read"], end
    assert "SIGUSR1" in seen and s["id"] in seen, seen  # and a line on her terminal said so
    assert _usage_reason(host, s["id"]) == "idle"
