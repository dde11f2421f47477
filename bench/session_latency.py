"""Session check-out + check-in latency and throughput: the daemon vs. the Go original's shape.

Runs, in one go and on this machine:

* calque: a real ``calque session serve`` process (SQLite WAL, synchronous=FULL) on a unix socket,
  on a simulated host with 8 A100-40GB cards cut into 56 x 1g.5gb MIG slices; each client is a
  separate process doing checkout + checkin round trips through ``SessionClient``.
* the clients run as an ordinary user (``--client-user``, default ``nobody``, when the bench runs as
  root), as on a real host: for a root client the daemon's handing of the slice's nodes to their
  holder is a different amount of work (before calque's session hardening it was none at all: root
  already owned the nodes), so root clients measure a case nobody uses.
* baseline: the Go original's registry shape, a JSON file read-modified-written under ``flock``
  (fsync'd, so every write is as durable as ours), by the same number of client processes, with no
  daemon round trip.

Prints p50/p99 of one checkout+checkin round trip and round trips per second at 1 and 32 clients,
side by side with ratios. Targets from the issue: p99 < 10 ms at 1 client, < 50 ms at 32 clients,
and at 32 clients at least the baseline's throughput.

    .venv/bin/python bench/session_latency.py [--seconds 2] [--repeat 3] [--clients 1,32]
"""

from __future__ import annotations

import argparse
import fcntl
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
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
CLI = "import sys; sys.argv[0] = 'calque'; from calque.cli.main import main; main()"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


# -- calque: real daemon -------------------------------------------------------------------------


CLIENT_IDS: tuple[int, int] | None = None  # (uid, gid) the client processes switch to, set by main()


def _become_client() -> None:
    if CLIENT_IDS is not None:
        os.setgroups([])
        os.setgid(CLIENT_IDS[1])
        os.setuid(CLIENT_IDS[0])


def _calque_worker(sock: str, seconds: float, start: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    from calque.session.client.connection import NoFreeSliceError, SessionClient

    _become_client()

    client = SessionClient(Path(sock))
    lat: list[float] = []
    busy = 0
    while time.time() < start:
        time.sleep(0.001)
    end = start + seconds
    while time.time() < end:
        t0 = time.perf_counter()
        try:
            s = client.call("checkout", ttl="10m")
        except NoFreeSliceError:
            busy += 1
            continue
        client.call("checkin", id=s["id"])
        lat.append(time.perf_counter() - t0)
    out.put((lat, busy))


def start_daemon(d: Path, processes: int = 1) -> subprocess.Popen[bytes]:
    from calque.gpu.sim import SimGpu

    sim = SimGpu.create(d / "gpus.json", ["A100-40GB"] * 8, mig=True, root=d / "root")
    for i in range(8):
        sim.create_instances(i, ["1g.5gb"] * 7)
    cfg = {
        "version": 1,
        "socket": str(d / "s.sock"),
        "db": str(d / "sessions.db"),
        "audit_log": str(d / "audit.jsonl"),
        "gpu_backend": "sim",
        "sim_state": str(d / "gpus.json"),
        "policy": {"default": {"max_sessions": 1000, "max_ttl": "8h"}},
        "processes": processes,
    }
    (d / "session.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "session", "serve", "--config", str(d / "session.yaml")],
        stdout=subprocess.DEVNULL,
        stderr=(d / "daemon.log").open("wb"),
    )
    from calque.session.client.connection import SessionClient

    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            SessionClient(d / "s.sock", retry_for=0).call("ping")
            return proc
        except Exception:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"daemon did not start: {(d / 'daemon.log').read_text()[-2000:]}")


# -- baseline: JSON file under flock --------------------------------------------------------------


def _locked_update(path: Path, fn: object) -> object:
    with path.open("r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            reg = json.loads(f.read() or "{}")
            result = fn(reg)  # type: ignore[operator]
            f.seek(0)
            f.truncate()
            f.write(json.dumps(reg))
            f.flush()
            os.fsync(f.fileno())
            return result
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _baseline_worker(path: str, seconds: float, start: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    _become_client()
    p = Path(path)
    me = os.getpid()
    lat: list[float] = []
    busy = 0

    def take(reg: dict[str, object]) -> str | None:
        for sid, holder in reg.items():
            if holder is None:
                reg[sid] = {"pid": me, "at": time.time()}
                return sid
        return None

    while time.time() < start:
        time.sleep(0.001)
    end = start + seconds
    while time.time() < end:
        t0 = time.perf_counter()
        sid = _locked_update(p, take)
        if sid is None:
            busy += 1
            continue
        _locked_update(p, lambda reg, s=sid: reg.__setitem__(s, None))
        lat.append(time.perf_counter() - t0)
    out.put((lat, busy))


# -- driver ---------------------------------------------------------------------------------------


def run(kind: str, target: str, clients: int, seconds: float) -> dict[str, float]:
    ctx = mp.get_context("fork")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    fn = _calque_worker if kind == "calque" else _baseline_worker
    start = time.time() + 0.5 + 0.02 * clients
    procs = [ctx.Process(target=fn, args=(target, seconds, start, q)) for _ in range(clients)]
    for p in procs:
        p.start()
    lat: list[float] = []
    busy = 0
    for _ in procs:
        part, b = q.get(timeout=seconds + 120)
        lat += part
        busy += b
    for p in procs:
        p.join(30)
    return {
        "p50_ms": statistics.median(lat) * 1000 if lat else float("nan"),
        "p99_ms": _pct(lat, 0.99) * 1000,
        "ops_s": len(lat) / seconds,
        "n": len(lat),
        "busy": busy,
    }


def _cpu_seconds(pid: int) -> float:
    """CPU of the daemon and its worker processes."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat.parent.name == str(pid) or fields[1] == str(pid):
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _median_row(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in ("p50_ms", "p99_ms", "ops_s")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0, help="length of one run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per side, interleaved; medians are quoted")
    ap.add_argument("--clients", default="1,32")
    ap.add_argument("--processes", type=int, default=2, help="daemon worker processes (config `processes`)")
    ap.add_argument(
        "--client-user",
        default="nobody",
        help="user the clients run as when the bench runs as root ('root': stay root)",
    )
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    global CLIENT_IDS
    if os.getuid() == 0 and args.client_user != "root":
        pw = pwd.getpwnam(args.client_user)
        CLIENT_IDS = (pw.pw_uid, pw.pw_gid)
    clients_as = pwd.getpwuid(CLIENT_IDS[0] if CLIENT_IDS else os.getuid()).pw_name
    d = Path(tempfile.mkdtemp(prefix="calque-bench-"))
    d.chmod(0o755)  # the clients' user reaches the socket (the daemon's files in it are 0600)
    daemon = start_daemon(d, args.processes)
    baseline = d / "registry.json"
    baseline.write_text(json.dumps({f"slice-{i}": None for i in range(56)}))
    if CLIENT_IDS is not None:
        os.chown(baseline, *CLIENT_IDS)
    try:
        print(
            f"checkout+checkin round trip; {args.repeat} interleaved runs of {args.seconds:g} s per side; "
            f"56 slices; daemon processes: {args.processes}; clients run as {clients_as}; "
            "every write fsync'd on both sides; "
            "figures are medians over the runs"
        )
        head = f"{'clients':>7}  {'calque p50':>10} {'p99':>7} {'trips/s':>8}  | "
        head += f"{'baseline p50':>12} {'p99':>7} {'trips/s':>8}"
        print(head + f"  | {'p99 ratio':>9} {'trips/s ratio':>13}")
        for n in counts:
            cs: list[dict[str, float]] = []
            bs: list[dict[str, float]] = []
            cpu = 0.0
            for _ in range(args.repeat):
                before = _cpu_seconds(daemon.pid)
                cs.append(run("calque", str(d / "s.sock"), n, args.seconds))
                cpu += (_cpu_seconds(daemon.pid) - before) / max(1.0, cs[-1]["n"])
                bs.append(run("baseline", str(baseline), n, args.seconds))
            c, b = _median_row(cs), _median_row(bs)
            print(
                f"{n:>7}  {c['p50_ms']:10.2f} {c['p99_ms']:7.2f} {c['ops_s']:8.0f}  | "
                f"{b['p50_ms']:12.2f} {b['p99_ms']:7.2f} {b['ops_s']:8.0f}  | "
                f"{c['p99_ms'] / b['p99_ms']:8.2f}x {c['ops_s'] / b['ops_s']:12.2f}x"
            )
            spread = ", ".join(f"{r['p99_ms']:.1f}" for r in cs)
            print(
                f"{'':9}(calque p99 per run: {spread} ms; daemon CPU per trip {cpu / args.repeat * 1000:.2f} ms; "
                f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
            )
        print("ratios: calque / baseline (p99: lower is better; trips/s: higher is better)")
        print("targets: p99 < 10 ms at 1 client, < 50 ms at 32 clients; trips/s at 32 clients >= baseline")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
