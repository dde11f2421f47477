"""`calque run` against a pool whose workers cannot load, or whose class lacks the method called."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from calque.cli.main import run
from pool.conftest import (
    PROC_WAIT,
    make_pool,  # noqa: F401  (the fixture: a queue, a bucket and real workers)
    wait_until,
)
from support.waits import HANG_S

pytestmark = pytest.mark.slow

BROKEN = """import modal

app = modal.App("broken")


@app.cls()
class Model:
    @modal.enter()
    def load(self):
        raise OSError("no GPU visible to this worker")

    @modal.method()
    def go(self, x):
        return x


@app.local_entrypoint()
def main():
    print("before")
    print(Model().go.remote(1))
"""

# What the pool serves (v1) and what the caller runs (v2): v2 added a method the pool's workers lack.
V1 = """import modal

app = modal.App("versions")


@app.cls()
class Model:
    @modal.method()
    def go(self, x):
        return x + 1
"""
V2 = (
    V1
    + """
    @modal.method()
    def newer(self, x):
        return x * 2


@app.local_entrypoint()
def main():
    print(Model().go.remote(1))
    print(Model().newer.remote(2))
"""
)


def _cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_pool_that_cannot_load_fails_the_call_before_sending_it(make_pool, capsys, tmp_path: Path) -> None:  # noqa: F811
    script = tmp_path / "broken.py"
    script.write_text(BROKEN)
    pool = make_pool(workload=f"{script}::Model", model="run-load/broken")
    worker = pool.start()
    assert worker.proc.wait(timeout=PROC_WAIT) == 3
    # Its own wait would last a hang's time: it fails before sending the call, so before any wait.
    code, out, err = _cli(capsys, ["run", "--pool", str(pool.write_spec()), "--timeout", f"{HANG_S:g}s", str(script)])
    assert code == 3
    assert out == "before\n"
    assert "cannot load their workload" in err and "OSError: no GPU visible to this worker" in err
    assert "Nothing of Model.go was sent." in err
    assert pool.queue.depth().visible == 0


def test_a_method_the_pools_class_lacks_is_refused_before_anything_is_sent(make_pool, capsys, tmp_path) -> None:  # noqa: F811
    served, caller = tmp_path / "served" / "versions.py", tmp_path / "versions.py"
    served.parent.mkdir()
    served.write_text(V1)
    caller.write_text(V2)
    pool = make_pool(workload=f"{served}::Model", model="run-load/versions")
    pool.start().wait_log("serving", timeout=PROC_WAIT)
    wait_until(lambda: pool.store._keys(f"s3://{pool.bucket}/{pool.store.base}/load/"), PROC_WAIT, "a load record")
    pools_file = tmp_path / "calque-run.yml"
    pools_file.write_text(yaml.safe_dump({"version": 1, "pools": {"Model": str(pool.write_spec())}}))
    code, out, err = _cli(capsys, ["run", "--pools", str(pools_file), "--timeout", "120", str(caller)])
    assert code == 2, err
    assert out == "2\n"  # .go ran on the pool; .newer never left this machine
    assert "Model.newer: the pool's workers serve" in err and "it has no method 'newer'" in err
    assert "['go']" in err
