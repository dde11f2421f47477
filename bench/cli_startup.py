"""Start-up time of a researcher's commands against a bare ``python -c pass``, side by side.

Each figure is the median wall time of N fresh processes (the installed ``calque`` console script,
as a researcher runs it). Measured, in one go and on this machine:

* ``--help`` of ``session checkout|checkin|status|list`` and ``pool status|results`` (what a command
  costs before it does anything: imports and click);
* real calls: ``session status`` and ``session list`` against a real session daemon on a simulated
  host, and ``pool status`` against a moto server on 127.0.0.1 (when moto is installed), so the
  libraries each command really needs (the client, pydantic, boto3) are counted too.

Targets: every researcher command's ``--help`` under 3x ``python -c pass`` (issue 13); ``session
status`` and ``session list`` against a running daemon within 2x a bare ``python -c 'import click'``
(issue 20; the ``x click`` column). Figures are printed, never asserted (tests do not time things).

    .venv/bin/python bench/cli_startup.py [--runs 15] [--no-calls]
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from session_latency import start_daemon

BIN = Path(sys.executable).parent
HELP = [
    ["session", "checkout", "--help"],
    ["session", "checkin", "--help"],
    ["session", "status", "--help"],
    ["session", "list", "--help"],
    ["pool", "status", "--help"],
    ["pool", "results", "--help"],
]


def _once(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    return time.perf_counter() - t0


def median_ms(cmd: list[str], runs: int, env: dict[str, str] | None = None) -> float:
    return statistics.median(_once(cmd, env) for _ in range(runs)) * 1000


def interleaved_ms(cmds: list[list[str]], runs: int) -> list[float]:
    """Each command's median over ``runs`` rounds that run every command once, in turn: a load that
    comes and goes (other processes on a shared machine) weighs on all of them alike."""
    times: list[list[float]] = [[] for _ in cmds]
    for _ in range(runs):
        for i, cmd in enumerate(cmds):
            times[i].append(_once(cmd))
    return [statistics.median(t) * 1000 for t in times]


@contextlib.contextmanager
def moto_server() -> Iterator[str | None]:
    """A moto server on a free loopback port, or None when moto is not installed."""
    exe = BIN / "moto_server"
    if not exe.exists():
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--no-calls", action="store_true", help="only --help (no daemon, no moto)")
    args = ap.parse_args()
    calque = str(BIN / "calque")
    # What a researcher runs is an installed wheel, whose modules pip compiled to bytecode, as click's
    # were; an editable checkout under PYTHONDONTWRITEBYTECODE would compile every calque module again in
    # each run and time the compiler. Compile them once first (git ignores __pycache__).
    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "runtime" / "calque"), quiet=1)
    base = median_ms([sys.executable, "-c", "pass"], args.runs)
    # the floor of any click command: what importing click alone costs here
    click_cmd = [sys.executable, "-c", "import click"]
    rows: list[tuple[str, float]] = [("python -c 'import click' (reference)", median_ms(click_cmd, args.runs))]
    rows += [(f"calque {' '.join(c)}", median_ms([calque, *c], args.runs)) for c in HELP]
    if not args.no_calls:
        d = Path(tempfile.mkdtemp(prefix="clistart", dir="/tmp"))
        daemon = start_daemon(d)
        try:
            sock = ["--socket", str(d / "s.sock")]
            # issue 20's figure: each call beside click in the same rounds (the reference row is these rounds')
            click_ms, *calls = interleaved_ms(
                [click_cmd, *([calque, "session", verb, *sock] for verb in ("status", "list"))], args.runs
            )
            rows[0] = (rows[0][0], click_ms)
            verbs = ("status", "list")
            rows += [(f"calque session {verb} (daemon)", ms) for verb, ms in zip(verbs, calls, strict=True)]
        finally:
            daemon.terminate()
            daemon.wait(10)
            shutil.rmtree(d, ignore_errors=True)
        with moto_server() as url:
            if url is not None:
                env = {
                    **os.environ,
                    "AWS_ACCESS_KEY_ID": "x",
                    "AWS_SECRET_ACCESS_KEY": "x",
                    "AWS_DEFAULT_REGION": "us-east-1",
                }
                cmd = [calque, "pool", "status", "--model", "bench", "--endpoint-url", url, "--region", "us-east-1"]
                rows.append(("calque pool status (moto, no queue)", median_ms(cmd, args.runs, env)))
    width = max(len(n) for n, _ in rows)
    print(
        f"median of {args.runs} runs; baseline python -c pass: {base:.1f} ms "
        "(targets: --help under 3.0x pass; session status/list (daemon) within 2.0x click)"
    )
    click_ms = rows[0][1]  # on a busy machine both move together: x click is the steadier figure
    print(f"{'command':<{width}}  {'ms':>7}  {'x pass':>7}  {'x click':>7}")
    for name, ms in rows:
        print(f"{name:<{width}}  {ms:7.1f}  {ms / base:6.2f}x  {ms / click_ms:6.2f}x")


if __name__ == "__main__":
    main()
