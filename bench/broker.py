"""The institution's front door: ``checkout --anywhere`` through the broker beside a host-local checkout.

Runs, in one go and on this machine (as root):

* a researcher on another host: ``--anywhere`` over the broker's TCP port, each request with a munge
  credential the client makes and the broker decodes, each answer sealed by the broker and checked;
* three real ``calque session serve`` daemons, each a simulated host with 2 A100-40GB cards cut into
  14 x 1g.5gb MIG slices, and a real ``calque session broker`` over them (the local path: each host's
  unix socket; a call for a user is made by a child that is that user);
* the clients run as an ordinary user (``--client-user``, default ``nobody``), each a separate process;
* munge: a private ``munged`` with a test key, called through libmunge (the real encode and decode
  path every cross-host request pays: one credential made by the caller, one decoded by the host).

Prints, side by side with ratios:

* one checkout's round trip, p50/p99: ``--anywhere`` through the broker (its unix socket, and its TCP
  port with munge) vs. the host's own socket (goal: anywhere p99 <= 3x local p99);
* grant latency after a free with 200 waiters queued: from the check-in's answer to the waiter's
  grant, p50/p99 (goal: p99 < 1 s);
* the same with two of the three hosts hung (SIGSTOP, on a fresh institution): a free on the healthy
  one reaches the head of the queue, p50/p99 (goal: p99 < 1 s);
* queue throughput: waiters joined per second, and grants per second draining a burst of frees;
* munge encode + decode per request, beside the local checkout it would add to.

    .venv/bin/python bench/broker.py [--trips 200] [--waiters 200] [--frees 30] [--hung-frees 14]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CLI = "import sys; sys.argv[0] = 'calque'; from calque.cli.main import main; main()"
HOSTS = ("hostA", "hostB", "hostC")
CLIENT: tuple[int, int] | None = None


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _become_client() -> None:
    if CLIENT is not None:
        os.setgroups([])
        os.setgid(CLIENT[1])
        os.setuid(CLIENT[0])


def _wait_for(fn: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = fn()
            if got:
                return got
        except Exception:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{what} did not happen within {timeout:g} s")


# -- the institution ------------------------------------------------------------------------------


def start_munged(m: Path) -> Path:
    """A private munged with a test key in ``m`` (0755: the clients make credentials too); its socket."""
    m.mkdir(mode=0o755)
    key = m / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    args = [f"--key-file={key}", f"--socket={m / 'sock'}", f"--log-file={m / 'log'}", f"--pid-file={m / 'pid'}"]
    subprocess.run(["munged", "--force", *args, f"--seed-file={m / 'seed'}"], check=True, timeout=30)
    return m / "sock"


def stop_munged(sock: Path) -> None:
    subprocess.run(["munged", "--stop", f"--socket={sock}"], capture_output=True, timeout=30)


def start_institution(d: Path, port: int, munge_socket: Path) -> list[subprocess.Popen[bytes]]:
    from calque.gpu.sim import SimGpu
    from calque.session.client.connection import SessionClient

    procs = []
    for name in HOSTS:
        h = d / name
        h.mkdir(mode=0o755)
        sim = SimGpu.create(h / "gpus.json", ["A100-40GB"] * 2, mig=True, root=h / "root")
        for i in range(2):
            sim.create_instances(i, ["1g.5gb"] * 7)
        for p in [h / "root", *(h / "root").rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)
        cfg = {
            "version": 1,
            "socket": str(h / "s.sock"),
            "db": str(h / "state/sessions.db"),
            "audit_log": str(h / "audit.jsonl"),
            "gpu_backend": "sim",
            "sim_state": str(h / "gpus.json"),
            "policy": {"default": {"max_sessions": 1000, "max_ttl": "8h"}},
            "max_connections_per_uid": 1024,
            "host_name": name,
            "broker_nudge": f"127.0.0.1:{port}",
            "munge_socket": str(munge_socket),  # its nudges are signed
        }
        (h / "session.yaml").write_text(yaml.safe_dump(cfg))
        procs.append(_spawn(["session", "serve", "--config", str(h / "session.yaml")], h / "daemon.log"))
    for name in HOSTS:
        _wait_for(lambda n=name: SessionClient(d / n / "s.sock", retry_for=0).call("ping"), f"{name} answering")
    b = d / "broker"
    b.mkdir(mode=0o755)
    bcfg = {
        "version": 1,
        "socket": str(b / "broker.sock"),
        "db": str(b / "state/broker.db"),
        "tcp_addr": "127.0.0.1",
        "tcp_port": port,
        "local_hosts": {n: str(d / n / "s.sock") for n in HOSTS},
        "institution": str(b / "institution.yaml"),
        "munge_socket": str(munge_socket),
        "audit_log": str(b / "audit/broker-audit.jsonl"),
        "queue": {"max_queued_per_user": 1000},
        "max_connections": 4096,
        "max_connections_per_uid": 4096,
    }
    (b / "broker.yaml").write_text(yaml.safe_dump(bcfg))
    inst = {"version": 1, "broker": {"name": "front", "address": "127.0.0.1", "port": port}}
    (b / "institution.yaml").write_text(yaml.safe_dump(inst))
    procs.append(_spawn(["session", "broker", "--config", str(b / "broker.yaml")], b / "broker.log"))
    from calque.session.client.broker import BrokerClient

    _wait_for(lambda: BrokerClient(b / "broker.sock").call("ping", {}), "the broker answering")
    return procs


def _hosts_view(d: Path) -> dict[str, bool]:
    from calque.session.client.broker import BrokerClient

    return {h.name: h.reachable for h in BrokerClient(d / "broker" / "broker.sock").hosts()}


def hung_latency(munge_socket: Path, frees: int) -> dict[str, float]:
    """A fresh institution with hostB and hostC stopped (SIGSTOP): grant latency of a free on hostA."""
    from calque.models.session import CheckoutArgs
    from calque.session.client.connection import SessionClient

    d = Path(tempfile.mkdtemp(prefix="calque-bench-hung-", dir="/tmp"))
    d.chmod(0o755)
    procs = start_institution(d, _free_port(), munge_socket)
    try:
        a = SessionClient(d / "hostA" / "s.sock")
        fillers = [a.checkout(CheckoutArgs(ttl="1h")).id for _ in range(14)]
        for p in procs[1:3]:  # hostB's and hostC's daemons
            os.killpg(p.pid, signal.SIGSTOP)
        _wait_for(lambda: _hosts_view(d) == {"hostA": True, "hostB": False, "hostC": False}, "B and C marked", 60)
        ctx = mp.get_context("fork")
        q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        waiter = ctx.Process(target=_waiters, args=(str(d / "broker" / "broker.sock"), frees, q))
        waiter.start()
        from calque.session.client.broker import BrokerClient

        broker = BrokerClient(d / "broker" / "broker.sock")
        _wait_for(lambda: sum(e.state == "queued" for e in broker.queue(True)) == frees, "every waiter queued", 120)
        lat = []
        for sid in fillers[:frees]:
            a.checkin(sid)
            freed = time.time()
            at, host, why = q.get(timeout=60)
            if host != "hostA":
                raise SystemExit(f"a waiter failed or went to a hung host: {host} {why}")
            lat.append(at - freed)
        waiter.kill()
        waiter.join(10)
        return {"p50": statistics.median(lat), "p99": _pct(lat, 0.99)}
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGCONT)
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(20)
        shutil.rmtree(d, ignore_errors=True)


def _free_port() -> int:
    import socket as so

    with so.socket(so.AF_INET, so.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CLI, *args], stdout=subprocess.DEVNULL, stderr=log.open("wb"), start_new_session=True
    )


# -- round trips ----------------------------------------------------------------------------------


def _trips(d: str, kind: str, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    from calque.models.broker import AnywhereArgs
    from calque.models.session import CheckoutArgs
    from calque.session.client.broker import BrokerAddress, BrokerClient
    from calque.session.client.connection import SessionClient
    from calque.session.munge import _library

    _library()  # libmunge and the codecs a TCP connection needs, loaded before this process drops to the client
    "127.0.0.1".encode("idna")
    _become_client()
    root = Path(d)
    local = {name: SessionClient(root / name / "s.sock") for name in HOSTS}
    broker = BrokerClient(root / "broker" / "broker.sock")
    if kind == "tcp":
        port = int(yaml.safe_load((root / "broker" / "broker.yaml").read_text())["tcp_port"])
        to = BrokerAddress("front", "127.0.0.1", port, "root", root / "munge" / "sock")
        broker = BrokerClient(root / "broker" / "absent.sock", remote=to)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        if kind == "local":
            s = local["hostA"].checkout(CheckoutArgs(ttl="10m"))
            host = "hostA"
        else:
            g = broker.anywhere(AnywhereArgs(ttl="10m"))
            s, host = g.session, g.host
        lat.append(time.perf_counter() - t0)
        local[host].checkin(s.id)
    out.put(lat)


def round_trips(d: Path, kind: str, n: int) -> list[float]:
    ctx = mp.get_context("fork")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    p = ctx.Process(target=_trips, args=(str(d), kind, n, q))
    p.start()
    lat: list[float] = q.get(timeout=600)
    p.join(30)
    return lat


# -- waiters --------------------------------------------------------------------------------------


def _waiters(sock: str, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    from calque.models.broker import AnywhereArgs
    from calque.session.client.broker import BrokerClient

    _become_client()

    def one() -> None:
        try:
            g = BrokerClient(Path(sock)).anywhere(AnywhereArgs(ttl="1h", wait=True))
            out.put((time.time(), g.host, g.session.id))
        except Exception as exc:
            out.put((time.time(), "error", str(exc)))

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def grant_latency(d: Path, waiters: int, frees: int) -> dict[str, float]:
    from calque.models.session import CheckoutArgs
    from calque.session.client.broker import BrokerClient
    from calque.session.client.connection import SessionClient

    local = {name: SessionClient(d / name / "s.sock") for name in HOSTS}
    broker = BrokerClient(d / "broker" / "broker.sock")
    fillers = [(name, local[name].checkout(CheckoutArgs(ttl="1h")).id) for name in HOSTS for _ in range(14)]
    ctx = mp.get_context("fork")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    per = 50
    t_join = time.perf_counter()
    procs = [
        ctx.Process(target=_waiters, args=(str(broker.path), min(per, waiters - i), q)) for i in range(0, waiters, per)
    ]
    for p in procs:
        p.start()
    _wait_for(lambda: sum(e.state == "queued" for e in broker.queue(True)) == waiters, "every waiter queued", 120)
    joined_s = time.perf_counter() - t_join
    lat = []
    for name, sid in fillers[:frees]:
        local[name].checkin(sid)
        freed = time.time()
        at, host, _ = q.get(timeout=30)
        if host == "error":
            raise SystemExit(f"a waiter failed: {_}")
        lat.append(at - freed)
    burst = fillers[frees:]
    t0 = time.time()
    for name, sid in burst:
        local[name].checkin(sid)
    last = max(q.get(timeout=60)[0] for _ in burst)
    drain_s = last - t0
    for p in procs:
        p.kill()
        p.join(10)
    return {
        "p50": statistics.median(lat),
        "p99": _pct(lat, 0.99),
        "joins_s": waiters / joined_s,
        "grants_s": len(burst) / drain_s,
        "burst": len(burst),
    }


# -- munge ----------------------------------------------------------------------------------------


def munge_cost(sock: Path, n: int) -> tuple[float, float]:
    """Median seconds of one encode and one decode through libmunge against a private munged."""
    lib = ctypes.CDLL("libmunge.so.2")
    lib.munge_ctx_create.restype = ctypes.c_void_p
    lib.munge_ctx_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
    lib.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.munge_decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p] + [ctypes.c_void_p] * 4
    ctx = lib.munge_ctx_create()
    lib.munge_ctx_set(ctx, 8, str(sock).encode())  # MUNGE_OPT_SOCKET
    payload = json.dumps(
        {"op": "checkout", "request_id": "r-" + "0" * 24, "host": "hostA", "sha256": "0" * 64}
    ).encode()
    enc, dec = [], []
    for _ in range(n):
        cred = ctypes.c_char_p()
        t0 = time.perf_counter()
        if lib.munge_encode(ctypes.byref(cred), ctx, payload, len(payload)) != 0:
            raise SystemExit("munge_encode failed")
        t1 = time.perf_counter()
        out, size, uid, gid = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_uint(), ctypes.c_uint()
        rc = lib.munge_decode(cred.value, ctx, *(ctypes.byref(x) for x in (out, size, uid, gid)))
        t2 = time.perf_counter()
        if rc != 0:
            raise SystemExit(f"munge_decode failed: {rc}")
        enc.append(t1 - t0)
        dec.append(t2 - t1)
    return statistics.median(enc), statistics.median(dec)


# -- driver ---------------------------------------------------------------------------------------


def main() -> None:
    global CLIENT
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trips", type=int, default=200)
    ap.add_argument("--waiters", type=int, default=200)
    ap.add_argument("--frees", type=int, default=30)
    ap.add_argument("--hung-frees", type=int, default=14, help="frees timed with two hosts hung (at most 14)")
    ap.add_argument("--client-user", default="nobody")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the broker acts for users, and the clients run as --client-user")
    pw = pwd.getpwnam(a.client_user)
    CLIENT = (pw.pw_uid, pw.pw_gid)
    from calque.session.broker.hosts import call_id  # noqa: F401 (the broker's modules import here, not in the clients)

    d = Path(tempfile.mkdtemp(prefix="calque-bench-broker-", dir="/tmp"))
    d.chmod(0o755)
    sock = start_munged(d / "munge")
    procs = start_institution(d, _free_port(), sock)
    hung: dict[str, float] = {}
    try:
        round_trips(d, "anywhere", 20)  # warm: imports, the broker's first lists
        local = round_trips(d, "local", a.trips)
        anywhere = round_trips(d, "anywhere", a.trips)
        tcp = round_trips(d, "tcp", a.trips)
        grants = grant_latency(d, a.waiters, a.frees)
        enc, dec = munge_cost(sock, 500)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(20)
    try:
        if a.hung_frees > 0:
            hung = hung_latency(sock, min(14, a.hung_frees))
    finally:
        stop_munged(sock)
        shutil.rmtree(d, ignore_errors=True)
    lp50, lp99 = statistics.median(local) * 1e3, _pct(local, 0.99) * 1e3
    ap50, ap99 = statistics.median(anywhere) * 1e3, _pct(anywhere, 0.99) * 1e3
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} CPUs)")
    print(f"{'':38} {'p50 ms':>9} {'p99 ms':>9}   {'ratio p99':>9}")
    print(f"{'checkout, host-local socket':38} {lp50:9.2f} {lp99:9.2f}")
    print(f"{'checkout --anywhere (broker)':38} {ap50:9.2f} {ap99:9.2f}   {ap99 / lp99:8.2f}x  (goal <= 3x)")
    tp50, tp99 = statistics.median(tcp) * 1e3, _pct(tcp, 0.99) * 1e3
    print(f"{'checkout --anywhere (TCP + munge)':38} {tp50:9.2f} {tp99:9.2f}   {tp99 / lp99:8.2f}x  (goal <= 3x)")
    g50, g99 = grants["p50"] * 1e3, grants["p99"] * 1e3
    print(
        f"{f'grant after a free, {a.waiters} waiters':38} {g50:9.2f} {g99:9.2f}   {g99 / 1000:8.2f}x  (of the 1 s goal)"
    )
    if hung:
        h50, h99 = hung["p50"] * 1e3, hung["p99"] * 1e3
        label = "grant after a free, 2 hosts hung"
        print(f"{label:38} {h50:9.2f} {h99:9.2f}   {h99 / 1000:8.2f}x  (of the 1 s goal)")
    burst = f"a burst of {grants['burst']:.0f} frees granted at {grants['grants_s']:.0f} grants/s"
    print(f"queue: {grants['joins_s']:.0f} waiters joined/s; {burst}")
    m = (enc + dec) * 1e3
    print(
        f"munge per request: encode {enc * 1e3:.3f} ms + decode {dec * 1e3:.3f} ms = {m:.3f} ms, "
        f"{m / lp50:.2f}x a local checkout's p50"
    )


if __name__ == "__main__":
    main()
