"""The daemon under abuse: garbage on the socket, races for slices, kill -9, restarts."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from calque.errors import CalqueError
from calque.session.client import verbs
from calque.session.client.connection import NoFreeSliceError
from support.waits import HANG_S

from .conftest import CLI, Host, User, wait_for


def _raw(host: Host, payload: bytes, *, close_write: bool = False, pause: float = 0.0) -> dict[str, object] | None:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(host.socket))
        # The daemon may hang up on an oversized request before reading it all.
        with contextlib.suppress(OSError):
            s.sendall(payload)
        if close_write:
            s.shutdown(socket.SHUT_WR)
        if pause:
            time.sleep(pause)
        try:
            data = s.recv(65536)
        except OSError:
            return None
    return json.loads(data) if data else None


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _ping(host: Host) -> bool:
    return host.client(retry_for=0).call("ping") == {"pong": True}


def test_garbage_truncated_oversized_and_slow_requests_get_errors_and_daemon_keeps_serving(host: Host) -> None:
    host.start(max_request_bytes=4096, request_timeout=0.5)
    cases = {
        "garbage": _raw(host, b"\x00\xffnot json at all\n"),
        "not an object": _raw(host, b"[1, 2, 3]\n"),
        "unknown op": _raw(host, b'{"version": 1, "op": "format_disk"}\n'),
        "unknown field": _raw(host, b'{"version": 1, "op": "ping", "user": "root"}\n'),
        "future version": _raw(host, b'{"version": 99, "op": "ping"}\n'),
        "truncated": _raw(host, b'{"version": 1, "op": "che', close_write=True),
        "oversized": _raw(host, b'{"version": 1, "op": "ping", "args": {"x": "' + b"A" * 100_000 + b'"}}\n'),
        "slow": _raw(host, b'{"version": 1, ', pause=1.5),
        "bad args": _raw(host, b'{"version": 1, "op": "checkout", "args": {"ttl": "forever"}}\n'),
    }
    for name, resp in cases.items():
        assert resp is not None, name
        assert resp["ok"] is False, name
        assert isinstance(resp["error"], dict) and resp["error"]["message"], name
    assert "protocol version 99 is newer" in cases["future version"]["error"]["message"]  # type: ignore[index]
    assert "larger than 4096" in cases["oversized"]["error"]["message"]  # type: ignore[index]
    assert "within" in cases["slow"]["error"]["message"]  # type: ignore[index]
    # A client that connects and vanishes, and a crowd of slow ones, do not stop anyone else.
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(host.socket))
    slow = [socket.socket(socket.AF_UNIX) for _ in range(20)]
    try:
        for s in slow:
            s.connect(str(host.socket))
        assert _ping(host)
        got = host.client().call("checkout", ttl="5m")
        assert got["slice_id"].startswith("MIG-")
    finally:
        for s in slow:
            s.close()
    assert host.proc is not None and host.proc.poll() is None
    assert _ping(host)


def _race(host: Host, n: int, results: list[object], barrier: threading.Barrier) -> list[threading.Thread]:
    def one(i: int) -> None:
        barrier.wait()
        try:
            results[i] = host.client(retry_for=30).call("checkout", profile="1g.5gb", ttl="1h")
        except NoFreeSliceError as exc:
            results[i] = exc
        except CalqueError as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 3])
def test_64_clients_racing_for_7_slices_exactly_7_win(host: Host, processes: int) -> None:
    host.start(processes=processes)
    results: list[object] = [None] * 64
    barrier = threading.Barrier(64)
    for t in _race(host, 64, results, barrier):
        t.join(HANG_S)
    wins = [r for r in results if isinstance(r, dict)]
    losses = [r for r in results if isinstance(r, NoFreeSliceError)]
    assert len(wins) == 7 and len(losses) == 57, [r for r in results if not isinstance(r, (dict, NoFreeSliceError))]
    assert len({w["slice_id"] for w in wins}) == 7
    assert {w["slice_id"] for w in wins} == {m.uuid for m in host.migs}
    listing = host.client().call("list")
    busy = {r["slice"]["id"]: r["session_id"] for r in listing if r["busy"]}
    assert busy == {w["slice_id"]: w["id"] for w in wins}


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_race_through_kill9_and_restart_keeps_every_granted_session(host: Host, processes: int) -> None:
    host.start(processes=processes)
    results: list[object] = [None] * 64
    barrier = threading.Barrier(65)
    threads = _race(host, 64, results, barrier)
    barrier.wait()
    host.kill9()  # mid-run: some requests are in flight, some clients are still connecting
    host.start(processes=processes)
    for t in threads:
        t.join(HANG_S)
    wins = [r for r in results if isinstance(r, dict)]
    assert len(wins) <= 7
    assert len({w["slice_id"] for w in wins}) == len(wins), "a slice was granted twice"
    live = {r["slice"]["id"]: r for r in host.client().call("list") if r["busy"]}
    for w in wins:
        row = live[w["slice_id"]]
        assert row["session_id"] == w["id"]
        assert row["busy_until"].replace("Z", "+00:00")[:19] == w["expires_at"].replace("Z", "+00:00")[:19]
    # Clients retry on a lost connection with the same request id, so nobody lost a slice they were given.
    assert len(wins) == 7
    assert len(live) == 7


@pytest.mark.slow
def test_restart_after_kill9_keeps_sessions_deadlines_and_nodes(host: Host, make_user: Callable[..., User]) -> None:
    alice = make_user()
    host.start()
    s = json.loads(host.cli(alice, "session", "checkout", "--ttl", "45m", "--json", check=True).stdout)
    host.kill9()
    host.start()
    mine = json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout)
    assert [(m["id"], m["slice_id"], m["expires_at"]) for m in mine] == [(s["id"], s["slice_id"], s["expires_at"])]
    mig = next(m for m in host.migs if m.uuid == s["slice_id"])
    for node in host.sim.capability_devices(mig):
        assert host.run_as(alice, ["/usr/bin/test", "-r", node]).returncode == 0


def test_wait_gets_the_slice_when_it_is_checked_in(host: Host, make_user: Callable[..., User]) -> None:
    host.start()
    held = [host.client().call("checkout", ttl="1h") for _ in range(7)]
    env = {**host.env, "CALQUE_SESSION_SOCKET": str(host.socket)}
    cmd = [*host.python, "-c", CLI, "session", "checkout", "--wait", "--wait-timeout", "60s", "--json"]
    waiter = subprocess.Popen(cmd, env=env, cwd=host.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The waiter's CLI must have found nothing free first: it says so once it waits (however slow its
        # start-up on a loaded box), and only then is a slice checked in.
        assert waiter.stderr is not None
        said = ""
        while "waiting for a free slice" not in said and (line := waiter.stderr.readline()):
            said += line
        assert "waiting for a free slice" in said, said
        host.client().call("checkin", id=held[3]["id"])
        out, err = waiter.communicate(timeout=HANG_S)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 0, said + err
    assert json.loads(out)["slice_id"] == held[3]["slice_id"]


def test_metrics_report_and_audit(host: Host, make_user: Callable[..., User]) -> None:
    import socket as so

    with so.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    alice = make_user()
    host.start(metrics_port=port)
    s1 = json.loads(host.cli(alice, "session", "checkout", "--json", check=True).stdout)
    host.cli(alice, "session", "extend", "--by", "5m", check=True)
    samples = _scrape(port)
    assert samples[("calque_session_slices", (("kind", "mig"), ("profile", "1g.5gb"), ("state", "busy")))] == 1
    assert samples[("calque_session_slices", (("kind", "mig"), ("profile", "1g.5gb"), ("state", "free")))] == 6
    assert samples[("calque_session_sessions", ())] == 1  # a count: who holds what is for admins only
    admin = _parse(host.cli(None, "session", "metrics", check=True).stdout)
    assert admin[("calque_session_sessions", (("user", alice.name),))] == 1
    assert samples[("calque_session_events_total", (("event", "checkout"),))] == 1
    assert samples[("calque_session_events_total", (("event", "extend"),))] == 1
    assert samples[("calque_session_trip_seconds_count", ())] == 0
    host.cli(alice, "session", "checkin", check=True)
    samples = _scrape(port)  # the ended session's trip (checkout to checkin) is one histogram observation
    assert samples[("calque_session_trip_seconds_count", ())] == 1
    assert samples[("calque_session_trip_seconds_bucket", (("le", "60"),))] == 1
    assert 0 <= samples[("calque_session_trip_seconds_sum", ())] < 60
    events = [e["event"] for e in host.audit_events() if e["session"] == s1["id"]]
    assert events == ["checkout", "extend", "checkin"]
    rep = json.loads(host.cli(alice, "session", "report", "--since", "1d", "--json", check=True).stdout)
    assert [(r["user"], r["profile"], r["sessions"]) for r in rep["rows"]] == [(alice.name, "1g.5gb", 1)]
    assert rep["rows"][0]["gpu_hours"] >= 0
    human = host.cli(alice, "session", "report", check=True).stdout
    assert alice.name in human and "GPU-HOURS" in human
    assert wait_for(lambda: _ping(host))


def test_events_count_from_the_daemons_start_also_in_a_restarted_metrics_process(
    host: Host, make_user: Callable[..., User]
) -> None:
    import os
    import signal
    import socket as so
    from pathlib import Path

    with so.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    alice = make_user()
    host.start(metrics_port=port)
    assert host.proc is not None
    host.cli(alice, "session", "checkout", check=True)

    def metrics_processes() -> list[int]:
        return [p for p in _workers(host.proc.pid) if b"metrics_main" in Path(f"/proc/{p}/cmdline").read_bytes()]  # type: ignore[union-attr]

    def checkouts_counted() -> float | None:
        try:
            return _scrape(port).get(("calque_session_events_total", (("event", "checkout"),)))
        except OSError:
            return None

    assert wait_for(lambda: len(metrics_processes()) == 1)
    (first,) = metrics_processes()
    os.kill(first, signal.SIGKILL)  # the main process starts another, after the checkout was written
    assert wait_for(lambda: metrics_processes() not in ([], [first]))
    assert wait_for(lambda: checkouts_counted() is not None)
    assert checkouts_counted() == 1


def test_non_admins_never_see_holders_on_the_metrics_endpoint(host: Host, make_user: Callable[..., User]) -> None:
    import socket as so

    with so.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prom = host.dir / "calque_session.prom"
    alice, bob = make_user(), make_user()
    host.start(metrics_port=port, metrics_textfile=str(prom))
    host.cli(alice, "session", "checkout", "--json", check=True)
    # bob, as himself, reads every place metrics are offered to him: the port, the textfile, the op
    scrape = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode())"
    seen = {
        "port": host.run_as(bob, [*host.python, "-c", scrape], env=host.env, check=True).stdout,
        "op": host.cli(bob, "session", "metrics", check=True).stdout,
    }
    # the textfile is rewritten every 10 s (node_exporter serves it to whoever reaches its port)
    assert wait_for(lambda: prom.exists() and "calque_session_sessions 1.0" in prom.read_text())
    seen["textfile"] = prom.read_text()
    for where, text in seen.items():
        samples = _parse(text)
        assert samples[("calque_session_sessions", ())] == 1, where  # the count is public
        assert alice.name not in text and 'user="' not in text, f"{where} names a holder to a non-admin"
    root = _parse(host.cli(None, "session", "metrics", check=True).stdout)
    assert root[("calque_session_sessions", (("user", alice.name),))] == 1  # admins still see holders
    bob_list = json.loads(host.cli(bob, "session", "list", "--json", check=True).stdout)
    assert all(st["holder"] is None for st in bob_list)  # as `list` hides them


def test_spot_host_warns_at_checkout_and_metrics_textfile_is_written(host: Host) -> None:
    prom = host.dir / "calque_session.prom"
    host.start(spot=True, metrics_textfile=str(prom))
    res = host.cli(None, "session", "checkout", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["spot"] is True
    assert "spot instance" in res.stderr and "every tenant" in res.stderr
    assert wait_for(prom.exists)
    samples = _parse(prom.read_text())
    assert samples[("calque_session_slices", (("kind", "mps"), ("profile", "mps"), ("state", "free")))] == 2
    assert [p.name for p in host.dir.glob("calque_session.prom*")] == [prom.name]  # written aside, then renamed


def test_idle_connections_to_the_metrics_port_cannot_exhaust_the_daemon(host: Host, make_user) -> None:
    import socket as so

    with so.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    host.start(metrics_port=port)
    assert host.proc is not None
    tasks = Path(f"/proc/{host.proc.pid}/task")
    counts = [-1]
    assert wait_for(lambda: counts.append(len(list(tasks.iterdir()))) or counts[-1] == counts[-2], every=1.0)
    threads_before = counts[-1]  # the daemon's own threads have all started
    idle = []
    for _ in range(64):  # far more than the backlog: the rest wait in SYN retries, none gets a thread
        c = so.socket()
        c.settimeout(0.3)
        with contextlib.suppress(OSError):
            c.connect(("127.0.0.1", port))
        idle.append(c)
    try:
        time.sleep(0.5)
        # the endpoint's one thread serves them in turn: no thread per connection
        assert len(list(tasks.iterdir())) == threads_before
        assert _ping(host)  # the daemon's own socket answers
        alice = make_user()
        host.cli(alice, "session", "checkout", "--json", check=True)
        # ... while the idle clients still hold the endpoint (it drops one each 5 s, in turn): the daemon
        # did not wait for them to go.
        assert any(_still_held(c) for c in idle), "served only once the endpoint had dropped every idle client"
    finally:
        for c in idle:
            c.close()
    # once the idle clients are gone (or timed out), the endpoint serves again
    assert wait_for(lambda: _scrape(port).get(("calque_session_sessions", ())) == 1)


def _still_held(c: socket.socket) -> bool:
    """Connected, and its server has neither answered nor closed it."""
    c.setblocking(False)
    try:
        c.recv(1)  # data or EOF: answered or closed
    except BlockingIOError:
        return True
    except OSError:  # never connected
        return False
    return False


def _parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return _parse(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())


def test_flags_and_environment_override_the_config_file(host: Host) -> None:
    import subprocess

    from calque.session.client.connection import SessionClient

    from .conftest import CLI, VENV_PY

    cfg = host.write_config()  # names host.socket, but flags and environment win
    sock = host.dir / "other.sock"
    env = {**host.env, "CALQUE_SESSION_AUDIT": str(host.dir / "env-audit.jsonl"), "PYTHONPATH": ""}
    cmd = [str(VENV_PY), "-c", CLI, "session", "serve", "--config", str(cfg), "--socket", str(sock)]
    cmd += ["--db", str(host.dir / "flag.db"), "--gpu-backend", "sim", "--gpu-state", str(host.sim.state_path)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = SessionClient(sock, retry_for=20)
        s = client.call("checkout", ttl="10m")
        assert s["slice_id"] in {m.uuid for m in host.migs}
        assert (host.dir / "flag.db").exists() and not (host.dir / "state/sessions.db").exists()
        assert '"event": "checkout"' in (host.dir / "env-audit.jsonl").read_text()
        assert not host.socket.exists()
    finally:
        proc.terminate()
        proc.wait(10)


def _workers(pid: int) -> list[int]:
    from pathlib import Path

    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == str(pid) and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return sorted(out)


def test_a_dead_worker_process_is_replaced_and_service_goes_on(host: Host) -> None:
    import os
    import signal

    host.start(processes=2)
    assert host.proc is not None
    assert wait_for(lambda: len(_workers(host.proc.pid)) == 2)  # type: ignore[union-attr]
    victim = _workers(host.proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    # SIGKILL is asynchronous: a request the victim accepted in its last instant is reset, as it
    # would be on a real crash. What must hold is that, once it is gone, nobody else notices.
    assert wait_for(lambda: not _running(victim))
    for _ in range(20):
        assert _ping(host)
    assert wait_for(lambda: len(_workers(host.proc.pid)) == 2 and victim not in _workers(host.proc.pid))  # type: ignore[union-attr]
    s = host.client().call("checkout", ttl="5m")
    assert host.client().call("checkin", id=s["id"])["end_reason"] == "checkin"


def test_inventory_follows_a_layout_change_at_once(host: Host) -> None:
    # The daemon caches the inventory, keyed by the GPU state's stamp: a destroyed MIG device is
    # never offered again, not even within the first second after the change.
    host.start()
    client = host.client()
    ids = {s["slice"]["id"] for s in client.call("list") if s["slice"]["kind"] == "mig"}
    assert ids == {m.uuid for m in host.migs}
    gone = host.migs[0]
    assert gone.ci_id is not None and gone.gi_id is not None
    host.sim.destroy_compute_instance(gone.gpu_index, gone.gi_id, gone.ci_id)
    host.sim.destroy_gpu_instance(gone.gpu_index, gone.gi_id)
    ids = {s["slice"]["id"] for s in client.call("list") if s["slice"]["kind"] == "mig"}
    assert ids == {m.uuid for m in host.migs[1:]}
    held = [client.call("checkout", ttl="10m") for _ in range(6)]
    assert gone.uuid not in {s["slice_id"] for s in held}


def test_wait_timeout_waits_the_full_time_and_says_what_it_waited(host: Host) -> None:
    host.start()
    for _ in range(7):  # every slice held
        host.client().call("checkout", ttl="1h")
    # The client's own wait, timed around it: no interpreter start-up in the figure.
    started = time.monotonic()
    with pytest.raises(NoFreeSliceError) as caught:
        verbs.checkout(
            host.client(), profile=None, mps=False, gpu=None, ttl=None, consent=False, wait=True, wait_timeout=5.0
        )
    elapsed = time.monotonic() - started
    said = re.search(r"\(waited (\d+(?:\.\d+)?) s\)", str(caught.value))
    assert said is not None, str(caught.value)
    # Not before its 5 s; that it returned at all (every slice stays held) is its timeout's doing.
    assert 5.0 <= float(said.group(1)) <= elapsed, (said.group(1), elapsed)
    # The command says the same.
    res = host.cli(None, "session", "checkout", "--wait", "--wait-timeout", "5s")
    assert res.returncode == 5, res.stderr
    said = re.search(r"\(waited (\d+(?:\.\d+)?) s\)", res.stderr)
    assert said is not None and float(said.group(1)) >= 5.0, res.stderr


def test_a_plain_checkout_on_an_mps_only_host_suggests_mps(host: Host, make_user: Callable[..., User]) -> None:
    alice = make_user()
    for gi in host.sim.gpu_instances(0):  # GPU 0's MIG slices gone: the L4's MPS slots are all there is
        for ci in gi.compute_instances:
            host.sim.destroy_compute_instance(0, gi.gi_id, ci.ci_id)
        host.sim.destroy_gpu_instance(0, gi.gi_id)
    host.start()
    res = host.cli(alice, "session", "checkout")
    assert res.returncode != 0
    assert "no MIG slices, only MPS slots: pass --mps" in res.stderr, res.stderr
    assert "--i-understand-shared-gpu-has-no-isolation" in res.stderr
    # What it suggests works.
    host.cli(alice, "session", "checkout", "--mps", "--i-understand-shared-gpu-has-no-isolation", check=True)
