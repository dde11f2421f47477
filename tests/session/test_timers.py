"""Time limits the daemon enforces itself, on real processes the holder runs on the slice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from support.waits import HANG_S

from .conftest import Host, User, as_user, wait_for

pytestmark = pytest.mark.slow

# A workload that writes down every signal it gets; with "ignore-term" it survives SIGTERM.
WORKLOAD = textwrap.dedent(
    """
    import signal, sys, time
    log = open(sys.argv[1], "a", buffering=1)
    def on(sig, frame):
        log.write(f"{signal.Signals(sig).name} {time.time()}\\n")
        if sig == signal.SIGTERM and sys.argv[2] != "ignore-term":
            sys.exit(0)
    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGTERM, on)
    log.write("started\\n")
    while True:
        time.sleep(0.05)
    """
)


def _spawn(host: Host, user: User, log: Path, mode: str, tty: int | None = None) -> subprocess.Popen[bytes]:
    script = host.dir / "workload.py"
    script.write_text(WORKLOAD)
    script.chmod(0o644)
    log.touch()
    log.chmod(0o666)
    p = subprocess.Popen(as_user(user, ["/usr/bin/python3", str(script), str(log), mode]), stdin=tty)
    assert wait_for(lambda: "started" in log.read_text())
    return p


def test_notice_then_termination_at_expiry_then_the_slice_is_freed(host: Host, make_user: Callable[..., User]) -> None:
    alice = make_user()
    host.start(notice_before=2.0, kill_grace=0.4)
    polite_log, stubborn_log = host.dir / "polite.log", host.dir / "stubborn.log"
    # Alice's terminal: a pty whose slave is her workload's stdin, as in a login session.
    master, slave = os.openpty()
    os.chown(os.ttyname(slave), alice.uid, -1)
    # Start the workloads first so that a loaded machine cannot push them past the notice.
    polite = _spawn(host, alice, polite_log, "exit-on-term", tty=slave)
    stubborn = _spawn(host, alice, stubborn_log, "ignore-term")
    try:
        s = json.loads(host.cli(alice, "session", "checkout", "--ttl", "4s", "--json", check=True).stdout)
        # The processes are "on the slice" the way NVML would say so: the backend lists them there.
        host.sim.add_process(s["slice_id"], polite.pid)
        host.sim.add_process(s["slice_id"], stubborn.pid)
        deadline = datetime.fromisoformat(s["expires_at"]).timestamp()
        assert polite.wait(HANG_S) == 0
        assert stubborn.wait(HANG_S) == -signal.SIGKILL
        os.set_blocking(master, False)
        seen = os.read(master, 65536).decode(errors="replace")
        assert f"session {s['id']}" in seen and "ends in" in seen, seen
    finally:
        os.close(master)
        os.close(slave)
        for p in (polite, stubborn):
            if p.poll() is None:
                p.kill()
                p.wait()
    polite_events = [line.split() for line in polite_log.read_text().splitlines()[1:]]
    stubborn_events = [line.split() for line in stubborn_log.read_text().splitlines()[1:]]
    audit = host.audit_events()
    assert [e[0] for e in polite_events] == ["SIGUSR1", "SIGTERM"], audit
    assert [e[0] for e in stubborn_events] == ["SIGUSR1", "SIGTERM"], audit
    # The notice came before the deadline, the termination at it.
    assert float(polite_events[0][1]) < deadline <= float(polite_events[1][1]) + 0.05

    assert wait_for(lambda: not any(r["busy"] for r in host.client().call("list")))
    ends = [e for e in host.audit_events() if e["session"] == s["id"] and e["event"] == "expiry"]
    assert len(ends) == 1
    # Freed by the expiry, once its processes were stopped: never before the deadline, nor before the
    # stubborn one got its SIGTERM (it logged it, so it was still alive then; SIGKILL came after).
    # How soon after is a timing goal (for bench/), not a test's.
    freed = datetime.fromisoformat(ends[0]["ts"]).timestamp()
    assert deadline <= float(stubborn_events[1][1]) + 0.05 and float(stubborn_events[1][1]) <= freed
    notices = [e for e in host.audit_events() if e["session"] == s["id"] and e["event"] == "notice"]
    assert len(notices) == 1 and sorted(notices[0]["pids"]) == sorted([polite.pid, stubborn.pid])
    mig = next(m for m in host.migs if m.uuid == s["slice_id"])
    for node in host.sim.capability_devices(mig):
        assert host.run_as(alice, ["/usr/bin/test", "-r", node]).returncode != 0


def test_other_users_processes_on_the_slice_are_never_signalled(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob = make_user(), make_user()
    host.start(notice_before=1.0, kill_grace=0.3)
    s = json.loads(host.cli(alice, "session", "checkout", "--ttl", "2s", "--json", check=True).stdout)
    log = host.dir / "bob.log"
    bob_proc = _spawn(host, bob, log, "exit-on-term")
    try:
        host.sim.add_process(s["slice_id"], bob_proc.pid)
        assert wait_for(lambda: not any(r["busy"] for r in host.client().call("list")))
        time.sleep(0.3)
        assert bob_proc.poll() is None
        assert log.read_text().splitlines() == ["started"]
    finally:
        bob_proc.kill()
        bob_proc.wait()


def test_idle_session_expires_and_a_busy_one_does_not(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob = make_user(), make_user()
    host.start(idle_expiry=2.0)
    log = host.dir / "busy.log"
    worker = _spawn(host, bob, log, "exit-on-term")
    try:
        busy = json.loads(host.cli(bob, "session", "checkout", "--ttl", "1h", "--json", check=True).stdout)
        host.sim.add_process(busy["slice_id"], worker.pid)
        s = json.loads(host.cli(alice, "session", "checkout", "--ttl", "1h", "--json", check=True).stdout)
        assert wait_for(lambda: any(e["event"] == "idle" and e["session"] == s["id"] for e in host.audit_events()))
        assert json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout) == []
        bobs = json.loads(host.cli(bob, "session", "status", "--json", check=True).stdout)
        assert [b["id"] for b in bobs] == [busy["id"]]
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.wait()


def test_checkin_stops_what_the_holder_left_running_on_the_slice(host: Host, make_user: Callable[..., User]) -> None:
    alice = make_user()
    host.start(kill_grace=0.5)
    log = host.dir / "left.log"
    proc = _spawn(host, alice, log, "exit-on-term")
    try:
        s = json.loads(host.cli(alice, "session", "checkout", "--ttl", "1h", "--json", check=True).stdout)
        host.sim.add_process(s["slice_id"], proc.pid)
        host.cli(alice, "session", "checkin", check=True)
        assert proc.wait(HANG_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert log.read_text().splitlines()[1].startswith("SIGTERM")


def test_a_second_notice_comes_before_the_end_on_the_terminals_and_an_extension_starts_them_again(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice = make_user()
    # Windows wide enough for the test's own steps on a loaded machine: 5 s from checkout to the first
    # notice (to list the worker on the slice), 3 s between the two notices (a timer late by more than
    # that sends them as one), and 15 s from the final notice to the end, in which the extension must
    # land. It extends by the first notice's lead, so wherever in those 15 s it lands, the new deadline
    # is beyond both notices again.
    host.start(notice_before=18.0, final_notice_before=15.0, kill_grace=0.3)
    log = host.dir / "alice.log"
    worker = _spawn(host, alice, log, "exit-on-term")  # before the checkout: its start takes none of the 5 s
    try:
        s = json.loads(host.cli(alice, "session", "checkout", "--ttl", "23s", "--json", check=True).stdout)
        host.sim.add_process(s["slice_id"], worker.pid)

        def notices() -> list[dict[str, object]]:
            return [e for e in host.audit_events() if e["session"] == s["id"] and e["event"] == "notice"]

        assert wait_for(lambda: len(notices()) == 2), notices()
        first, final = notices()
        assert first["pids"] == [worker.pid] and final["pids"] == []  # the signal once, the terminal line twice
        assert log.read_text().count("SIGUSR1") == 1
        # Extended: the deadline moved, so both notices come again before the new one.
        assert host.cli(alice, "session", "extend", s["id"], "--by", "18s").returncode == 0
        assert wait_for(lambda: len(notices()) == 4), notices()
    finally:
        worker.kill()
        worker.wait()
