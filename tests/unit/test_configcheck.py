"""``calque config check KIND FILE``: the roles' validate step reads a file exactly as its service will."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from calque.cli.main import run
from calque.models import PoolSpec
from calque.pool.worker.worker_process import shutdown_bound_s
from support.waits import HANG_S

GOOD = {
    "host": "gpu:\n  backend: sim\n  sim: {state: /run/calque-sim/gpus.json, instance_type: p5.48xlarge, mig: true}\n",
    "session": "version: 1\ndefault_ttl: 2h\nmps:\n"
    "  - {gpu: 0, slots: 4, active_thread_percentage: 25, pinned_mem_limit_mib: 11000}\n"
    "policy: {admin_group: staff, groups: {lab: {max_sessions: 2}}}\n",
    "pool": "model: lab/embedder\nworkload: /opt/calque/pool/embed.py::Embedder\nbucket: lab-runs\n"
    "workers: 2\ncuda_visible_devices: ['0', '1']\nshutdown_grace_s: 20\nqueue: {receive_wait: 10}\n",
}
BAD = {  # one bad field each, and the name the message must carry
    "host": ("gpu:\n  backend: sim\n", "sim"),
    "session": ("version: 1\nmax_total_ttl: forever\n", "forever"),
    "pool": (
        "model: m\nworkload: w.py\nbucket: bkt\nworkers: 2\ncuda_visible_devices: ['0']\n",
        "cuda_visible_devices",
    ),
}


@pytest.mark.parametrize("kind", GOOD)
def test_a_good_file_passes_with_a_summary(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / f"{kind}.yaml"
    f.write_text(GOOD[kind])
    assert run(["config", "check", kind, str(f), "--file-only", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == kind and out["path"] == str(f)
    assert out["summary"]


@pytest.mark.parametrize("kind", BAD)
def test_a_bad_file_exits_2_naming_file_and_field(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, name = BAD[kind]
    f = tmp_path / f"{kind}.yaml"
    f.write_text(text)
    assert run(["config", "check", kind, str(f), "--file-only"]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and name in err


def test_session_summary_counts_mps_slots_and_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "session.yaml"
    f.write_text(GOOD["session"])
    assert run(["config", "check", "session", str(f), "--file-only", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["mps_slots"] == 4
    assert summary["default_ttl_s"] == 7200
    assert summary["admin_group"] == "staff" and summary["group_limits"] == ["lab"]


def test_pool_spec_from_stdin_reports_the_workers_shutdown_bound() -> None:
    # what the pool_worker role reads for TimeoutStopSec: the worker's own bound, from the same function
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "calque"), "config", "check", "pool", "-", "--json"],
        input=GOOD["pool"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)["summary"]
    spec = PoolSpec.model_validate(
        {
            "model": "lab/embedder",
            "workload": "x",
            "bucket": "lab-runs",
            "shutdown_grace_s": 20,
            "queue": {"receive_wait": 10},
        }
    )
    # a 10 s long poll is waited out a slice (1 s) at a time, so a stop waits at most that much of it
    assert summary["shutdown_bound_s"] == shutdown_bound_s(spec) == 1 + 2 * 20 + 5
    assert summary["workers"] == 2 and summary["cuda_visible_devices"] == ["0", "1"]
    assert summary["queue_name"].startswith("calque-pool-lab-embedder-")


def test_a_missing_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["config", "check", "session", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def _one_gpu_host(tmp_path: Path) -> Path:
    """A simulated one-GPU (L40S) host and a session config that names it, as the role renders one."""
    from calque.gpu.sim import SimGpu

    SimGpu.create(tmp_path / "gpus.json", ["L40S-48GB"])
    host = tmp_path / "host.yaml"
    host.write_text(f"gpu:\n  backend: sim\n  sim: {{state: {tmp_path / 'gpus.json'}}}\n")
    return host


@pytest.mark.parametrize("gpu", [0, 1])
def test_a_session_config_is_checked_against_this_hosts_gpus(
    gpu: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = _one_gpu_host(tmp_path)
    f = tmp_path / "session.yaml"
    slot = f"{{gpu: {gpu}, slots: 16, active_thread_percentage: 6, pinned_mem_limit_mib: 2000}}"
    f.write_text(f"version: 1\ngpu_backend: host\nhost_config: {host}\nmps:\n  - {slot}\n")
    if gpu == 1:  # the daemon would crash-loop on it: refused here, naming the GPU and what the host has
        assert run(["config", "check", "session", str(f)]) == 2
        err = capsys.readouterr().err
        assert "on this host, mps config names GPU 1, but this host has GPUs [0]" in err
        assert "Traceback" not in err
        assert run(["config", "check", "session", str(f), "--file-only"]) == 0  # the file alone is well formed
        return
    assert run(["config", "check", "session", str(f), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert (summary["host_gpus"], summary["mps_slots_per_gpu"]) == (1, {"0": 16})


def test_standard_input_is_checked_as_the_file_would_be(tmp_path: Path) -> None:
    host = _one_gpu_host(tmp_path)
    slot = "{gpu: 3, slots: 1, active_thread_percentage: 9, pinned_mem_limit_mib: 9}"
    text = f"version: 1\ngpu_backend: host\nhost_config: {host}\nmps:\n  - {slot}\n"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "calque"), "config", "check", "session", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 2 and "names GPU 3" in proc.stderr, proc.stderr
    assert "calque-config-check-" not in proc.stderr  # not the staged copy's name


def test_a_host_configuration_from_standard_input_names_the_bad_key_not_a_staged_file() -> None:
    text = "gpu:\n  version: 1\n  backend: sim\n  sim: {state: /var/lib/calque/gpus.json, instance_tpye: g6e.xlarge}\n"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "calque"), "config", "check", "host", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 2, proc.stderr
    assert "(standard input): sim.instance_tpye='g6e.xlarge': Extra inputs are not permitted" in proc.stderr
    assert "calque-config-check-" not in proc.stderr and "Traceback" not in proc.stderr


TCP_SESSION = "version: 1\ngpu_backend: none\nhost_name: teach-1\nlisten_tcp: {address: 10.0.0.11, port: 7461}\n"


def _institution(tmp_path: Path, hosts: str) -> Path:
    f = tmp_path / "institution.yaml"
    f.write_text(f"version: 1\nhosts: {hosts}\nlabs: [{{name: lab-a, groups: [lab-a]}}]\n")
    return f


@pytest.mark.parametrize(
    ("hosts", "words"),
    [
        ("[{name: research-1, address: 10.0.0.21}]", ["lists no host named 'teach-1'", "its hosts: research-1"]),
        ("[{name: teach-1, address: 10.0.0.11, port: 7462}]", ["port 7461", "on port 7462"]),
        ("[{name: teach-1, address: 10.0.0.11, prot: 7461}]", ["prot", "Extra inputs are not permitted"]),
    ],
)
def test_a_session_config_is_refused_with_an_institution_it_cannot_run_with(
    hosts: str, words: list[str], tmp_path: Path
) -> None:
    """The role's check: the session config on standard input, with the institution it is about to install
    (staged); a daemon listening on TCP must be one of its hosts on that port, and the file must load."""
    inst = _institution(tmp_path, hosts)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "calque"), "config", "check", "session", "-", "--institution", str(inst)],
        input=TCP_SESSION,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(inst) in proc.stderr and all(w in proc.stderr for w in words), proc.stderr


def test_a_session_config_passes_with_the_institution_that_lists_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inst = _institution(tmp_path, "[{name: teach-1, address: 10.0.0.11}]")
    f = tmp_path / "session.yaml"
    f.write_text(TCP_SESSION)
    assert run(["config", "check", "session", str(f), "--file-only", "--institution", str(inst), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert (summary["institution"], summary["institution_hosts"], summary["labs"]) == (str(inst), 1, ["lab-a"])
    # the file it names is the default: a config naming a missing institution cannot listen on TCP
    f.write_text(TCP_SESSION + f"institution: {tmp_path / 'absent.yaml'}\n")
    assert run(["config", "check", "session", str(f), "--file-only"]) == 0  # the names are another machine's
    assert run(["config", "check", "session", str(f), "--file-only", "--institution", str(inst)]) == 0
    capsys.readouterr()
    assert run(["config", "check", "session", str(f)]) == 2
    assert "none: the file does not exist" in capsys.readouterr().err
    assert run(["config", "check", "host", str(f), "--institution", str(inst)]) == 2


def test_a_broker_config_is_checked_with_the_institution_it_will_run_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "broker.yaml"
    f.write_text("version: 1\ntcp_addr: 0.0.0.0\ntcp_port: 7460\n")
    inst = tmp_path / "institution.yaml"
    inst.write_text("version: 1\nbroker: {name: front, address: 10.0.0.5, port: 7470}\n")
    assert run(["config", "check", "broker", str(f), "--institution", str(inst)]) == 2
    err = capsys.readouterr().err
    assert "port 7460 (tcp_port)" in err and str(inst) in err and "as 7470" in err
    inst.write_text("version: 1\nbroker: {name: front, address: 10.0.0.5, port: 7460}\nlabs: [{name: lab-a}]\n")
    assert run(["config", "check", "broker", str(f), "--institution", str(inst)]) == 2  # a lab needs groups
    assert "groups" in capsys.readouterr().err
    inst.write_text("version: 1\nbroker: {name: front, address: 10.0.0.5, port: 7460}\n")
    assert run(["config", "check", "broker", str(f), "--institution", str(inst), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["institution"] == str(inst)
