"""`calque run`'s closing line names the pool that served the run (its name), not the model it serves."""

from __future__ import annotations

from pathlib import Path

import pytest
from calque.aws.clients import client
from calque.aws.queue import PoolQueue
from calque.cli.main import run
from calque.models import QueueSettings
from pool.conftest import make_pool  # noqa: F401  (the fixture: a queue, a bucket and real workers)

CORPUS = Path(__file__).resolve().parent / "corpus"

pytestmark = pytest.mark.slow


def test_the_summary_names_the_named_pool_not_its_model(make_pool, capsys) -> None:  # noqa: F811
    lab = "lab-a/remote-loop"
    pool = make_pool(workload=f"{CORPUS / 'remote_loop.py'}::Model", model="org/shared-model", pool=lab)
    named = PoolQueue(client("sqs"), pool.model, pool=lab)  # a named pool's queue derives from its name
    named.ensure(QueueSettings(visibility_timeout=30, receive_wait=1, max_receive_count=10, encryption=False))
    worker = pool.start()
    worker.wait_log("serving", timeout=180)
    capsys.readouterr()
    code = run(["run", "--pool", str(pool.write_spec()), "--timeout", "180", str(CORPUS / "remote_loop.py")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"(0 failed) on pool {lab};" in err, err
    assert "on pool org/shared-model" not in err
