"""The README's first command, ``scripts/sandbox``, runs the whole pool flow and prints what it did."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QUEUE = r"calque-sandbox-embedder-[0-9a-f]{8}"  # named from the pool sandbox/embedder


@pytest.mark.slow
def test_sandbox_runs_the_pool_flow_end_to_end_and_cleans_up() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CALQUE_", "ANSIBLE_"))}
    env["CALQUE_SANDBOX_INSTITUTION"] = "skip"  # the same site.yml flow runs, deeper, in tests/hosts/test_site_e2e.py
    proc = subprocess.run(
        [str(REPO / "scripts" / "sandbox")], capture_output=True, text=True, env=env, timeout=600, cwd="/"
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr

    # pool.yml: gate, bucket, queue, workload, spec, template and a group of 2 through the Acquirer; then unchanged
    recaps = re.findall(r"localhost\s+: ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", out)
    assert len(recaps) == 3, out  # pool.yml twice, teardown.yml once
    assert int(recaps[0]) >= 4 and recaps[1] == "0"
    assert re.search(rf"queue_url\s+http://127\.0\.0\.1:\d+/\d+/{QUEUE}\n", out)
    assert re.search(rf"dlq_arn\s+arn:aws:sqs:us-east-1:\d+:{QUEUE}-dlq", out)
    assert re.search(rf"workload: s3://calque-sandbox-runs/calque/pools/{QUEUE}/workload/embedder.py::Embedder", out)
    launched = re.findall(r"^  (i-[0-9a-f]+)  g6\.xlarge  \S+  InService  config [0-9a-f]{16}$", out, re.M)
    assert len(launched) == 2, out
    assert re.search(
        r"sandbox/embedder\s+group calque-sandbox-embedder-[0-9a-f]{8}\s+2/2\s+0\.\.3", out
    )  # calque pool list

    # two local workers entered once each; two runs, every item ok, the second all warm hits
    assert len(re.findall(r"entered in \d+\.\d+s \(enter count 1\)", out)) == 2
    runs = re.findall(
        r"run (run-\S+): (\d+)/(\d+) items ok, (\d+) failed; claims (\d+)/(\d+); warm hits (\d+)/(\d+); "
        r"enter seconds paid (\d+\.\d+)",
        out,
    )
    assert len(runs) == 2, out
    for _run, ok, items, failed, done, claims, _hits, _of, _paid in runs:
        assert ok == items == "16" and failed == "0" and done == claims == "4"
    first, second = runs
    assert float(first[8]) > 0  # the first run paid the workers' enter
    assert second[6] == second[7] == "4" and float(second[8]) == 0.0  # warm hits only, nothing paid
    # calque run: the script's own local entrypoint, its .map streamed back in input order, warm
    lines = re.findall(r"^'sentence (\d+)' -> \[[^]]+\] \(demo-embedder-8d\)$", out, re.M)
    assert lines == [str(i) for i in range(12)], out
    tally = r"calque run: 12 of 12 items done \(0 failed\) on pool sandbox/embedder; .*enter paid 0\.00s"
    assert re.search(tally, proc.stderr), proc.stderr  # the tally goes to stderr, beside the progress
    assert re.search(rf"{QUEUE}\s+0\s+0\s+0\s+0", out)  # calque pool status: nothing left queued

    # teardown: workers stopped by SIGTERM, the group drained (its instances terminated), queue removed, moto stopped
    assert out.count("stopped (sigterm) after") == 2
    assert len(re.findall(r"worker pid \d+: exited 0", out)) == 2
    for iid in launched:
        assert re.search(rf"^  {iid}  terminated$", out, re.M), out
    assert '"queue_removed": true' in out
    for pid in re.findall(r"worker \d: pid (\d+)", out):
        assert not Path(f"/proc/{pid}").exists()
    moto = re.search(r"stopped moto \(pid (\d+)\)", out)
    assert moto, out
    assert not Path(f"/proc/{moto.group(1)}").exists()
