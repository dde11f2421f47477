"""bench/replay's task -> request mapping on a tiny CSV written here (the real trace is never needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.replay.mapping import DAY, Window, covering, demand  # noqa: E402
from bench.replay.trace import TraceError, read_tasks  # noqa: E402

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)
OFFERED = ("3g.20gb", "4g.20gb", "7g.40gb")


def _csv(tmp_path: Path, rows: list[str]) -> Path:
    p = tmp_path / "pods.csv"
    p.write_text(HEADER + "".join(r + "\n" for r in rows))
    return p


def test_each_task_becomes_a_request_or_is_set_aside_and_counted(tmp_path: Path) -> None:
    d1 = int(DAY)
    trace = _csv(
        tmp_path,
        [
            f"p-half,8000,1,1,470,,LS,Running,{d1 + 7200},{d1 + 7200 + 3600 + 60},{d1 + 7260}",  # 0.47 -> 4g
            f"p-small,8000,1,1,230,,BE,Succeeded,{d1 + 720},{d1 + 1720},{d1 + 720}",  # 0.23 -> 2g -> 3g served
            f"p-big,8000,1,1,810,,BE,Running,{d1},{d1 + 72000},{d1 + 100}",  # 0.81 -> 7g
            f"p-whole,8000,1,1,1000,,LS,Running,{d1},{d1 + 50},{d1}",
            f"p-two,8000,1,2,1000,,LS,Running,{d1},{d1 + 50},{d1}",
            f"p-cpu,8000,1,0,0,,BE,Running,{d1},{d1 + 50},{d1}",
            f"p-pending,8000,1,1,300,,BE,Pending,{d1 + 10},,",
            f"p-before,8000,1,1,300,,BE,Running,{d1 - 1},{d1 + 50},{d1}",
            f"p-after,8000,1,1,300,,BE,Running,{2 * d1},{2 * d1 + 50},{2 * d1}",
        ],
    )
    d = demand(read_tasks(trace), Window(start_day=1, days=1, compression=720), OFFERED)
    got = {r.task: (r.lab, r.asked, r.profile, r.arrival, r.hold) for r in d.requests}
    assert got == {
        "p-big": ("be", "7g.40gb", "7g.40gb", 0.0, (72000 - 100) / 720),
        "p-small": ("be", "2g.10gb", "3g.20gb", 1.0, 1000 / 720),
        "p-half": ("ls", "4g.20gb", "4g.20gb", 10.0, 3600 / 720),
    }
    assert [r.task for r in d.requests] == ["p-big", "p-small", "p-half"]  # by arrival
    assert d.set_aside == {
        "whole GPU(s): the pool's (part 3)": 2,
        "no GPU": 1,
        "never scheduled (no run time)": 1,
        "outside the window": 2,
    }


def test_the_covering_profile_is_the_smallest_whose_share_is_enough() -> None:
    assert covering(142) == "1g.5gb"  # 1/7 = 0.1428...
    assert covering(143) == "2g.10gb"
    assert covering(429) == "4g.20gb"  # just over 3/7
    assert covering(571) == "4g.20gb"
    assert covering(999) == "7g.40gb"
    assert covering(300, OFFERED) == "3g.20gb"


def test_a_missing_or_wrong_trace_says_where_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"github\.com/alibaba/clusterdata"):
        read_tasks(tmp_path / "absent.csv")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="lacks the columns"):
        read_tasks(tmp_path / "other.csv")
    bad = _csv(tmp_path, ["p,1,1,1,300,,BE,Running,soon,5,1"])
    with pytest.raises(TraceError, match="line 2"):
        read_tasks(bad)
