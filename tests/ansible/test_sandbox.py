"""The README's first command, ``scripts/sandbox``, runs to the end and prints what it did."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sandbox_creates_the_pool_queue_and_stops_moto() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CALQUE_", "ANSIBLE_"))}
    proc = subprocess.run(
        [str(REPO / "scripts" / "sandbox")], capture_output=True, text=True, env=env, timeout=600, cwd="/"
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "changed=1" in out  # the first playbook run created the queue
    assert re.search(r"localhost\s+: ok=\d+\s+changed=0", out)  # the second changed nothing
    assert re.search(r"queue_url\s+http://127\.0\.0\.1:\d+/\d+/calque-pool-sandbox-echo-[0-9a-f]{8}\n", out)
    assert re.search(r"dlq_arn\s+arn:aws:sqs:us-east-1:\d+:calque-pool-sandbox-echo-[0-9a-f]{8}-dlq", out)
    assert re.search(r"calque-pool-sandbox-echo-[0-9a-f]{8}\s+0\s+0\s+0\s+0", out)  # calque pool status
    pid = re.search(r"stopped moto \(pid (\d+)\)", out)
    assert pid, out
    assert not Path(f"/proc/{pid.group(1)}").exists()
