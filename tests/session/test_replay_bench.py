"""bench/replay end to end on a tiny trace written here: real daemons, a real broker, real lab users.

Two tasks that each need a whole-card slice (7g.40gb) arrive 10 trace-seconds apart on one host that
has one: the second waits for the first's check-in, and the table says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.waits import HANG_S

pytestmark = pytest.mark.slow  # real daemons and a broker: about 10 s

REPO = Path(__file__).resolve().parents[2]
HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)


def test_a_tiny_trace_replays_through_the_real_broker(tmp_path: Path) -> None:
    trace = tmp_path / "pods.csv"
    trace.write_text(
        HEADER
        + "p-first,1,1,1,810,,BE,Running,0,600,0\n"  # holds 600 trace s = 3 replay s
        + "p-second,1,1,1,650,,LS,Running,10,400,100\n"
        + "p-whole,1,1,1,1000,,LS,Running,5,50,5\n"  # set aside: the pool's
    )
    args = ["--trace", str(trace), "--start-day", "0", "--days", "0.008", "--compression", "200", "--hosts", "1"]
    res = subprocess.run(
        # --grace: the second's grant is waited for, not raced against the window's end
        [
            sys.executable,
            "-m",
            "bench.replay",
            *args,
            "--policies",
            "fifo",
            "--holders",
            "prompt",
            "--grace",
            str(HANG_S),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "whole GPU(s): the pool's (part 3) 1" in out and "2 requests replayed" in out
    rows = {tuple(line.split()[:2]): line.split() for line in out.splitlines() if line.startswith("fifo ")}
    assert rows[("fifo", "overall")][2:6] == ["2", "2", "0", "0"]  # requests, granted, queued at end, errors
    # The second (arriving 10 trace s after the first) waited for the first's 600 s hold: about 9.8 min.
    assert float(rows[("fifo", "ls")][6].rstrip("m")) >= 9.0
    assert float(rows[("fifo", "be")][6].rstrip("m")) < 9.0


def test_a_missing_trace_says_where_to_get_it(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "bench.replay", "--trace", str(tmp_path / "absent.csv")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert res.returncode == 2 and "github.com/alibaba/clusterdata" in res.stderr


def test_idle_reclaim_ends_the_idle_booked_session_and_no_active_one(tmp_path: Path) -> None:
    """A booked holder works 600 trace s, then leaves its slice idle to its 1 h TTL; the host daemon's real
    idle reclaim (30 trace min) ends it first, and the second request gets the slice then, not at the TTL."""
    trace = tmp_path / "pods.csv"
    trace.write_text(
        HEADER
        + "p-first,1,1,1,810,,BE,Running,0,600,0\n"  # busy 1.5 replay s, booked 9 s, reclaimed after 4.5 s idle
        + "p-second,1,1,1,650,,LS,Running,10,400,100\n"
    )
    args = ["--trace", str(trace), "--start-day", "0", "--days", "0.05", "--compression", "400", "--hosts", "1"]
    res = subprocess.run(
        [sys.executable, "-m", "bench.replay", *args, "--policies", "fair-reclaim", "--grace", str(HANG_S)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_S * 2,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "holders (booked" in out and "idle reclaim: for 30 trace min = 4.5 replay s" in out
    rows = {tuple(line.split()[:2]): line.split() for line in out.splitlines() if line.startswith("fair-reclaim ")}
    assert rows[("fair-reclaim", "overall")][2:6] == ["2", "2", "0", "0"]
    # Granted when the first was reclaimed (about 1.5 + 4.5 replay s: ~40 trace min), before its TTL (60 min).
    assert float(rows[("fair-reclaim", "ls")][6].rstrip("m")) < 58.0
    reclaim = next(s for line in out.splitlines() if (s := line.split())[0:1] == ["fair-reclaim"] and len(s) == 5)
    held, reclaimed, ended, active = float(reclaim[1]), float(reclaim[2]), int(reclaim[3]), int(reclaim[4])
    assert (ended, active) == (1, 0) and 0 < reclaimed < held
