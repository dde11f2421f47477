"""Generator methods stream: `.remote_gen` on a pool yields what `--local` yields, while the method runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from calque.cli.main import run
from pool.conftest import (
    PROC_WAIT,
    make_pool,  # noqa: F401  (the fixture: a queue, a bucket and real workers)
)

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "corpus" / "streaming.py"
EXPECTED = (
    "['alpha-0', 'beta-1', 'gamma-2', 'alpha-3', 'beta-4', 'gamma-5', 'alpha-6']\n"
    "count 3\ncount 2\ncount 1\n"
    "stream ended with ValueError('no more after 4') after [{'i': 0}, {'i': 1}, {'i': 2}, {'i': 3}]\n"
    "handshake first\nhandshake second\n"
)


def _cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_remote_gen_streams_on_a_pool_as_it_does_locally(make_pool, capsys, tmp_path) -> None:  # noqa: F811
    pool = make_pool(workload=f"{SCRIPT}::Streamer", model="run-stream/streamer")
    worker = pool.start()
    worker.wait_log("serving", timeout=PROC_WAIT)
    code, local_out, err = _cli(capsys, ["run", "--local", str(SCRIPT), "--n", "7", "--marker", str(tmp_path / "l")])
    assert code == 0, err
    assert local_out == EXPECTED
    args = ["run", "--pool", str(pool.write_spec()), "--timeout", "120", str(SCRIPT)]
    code, pool_out, err = _cli(capsys, [*args, "--n", "7", "--marker", str(tmp_path / "p")])
    assert code == 0, (err, worker.stderr())
    assert pool_out == EXPECTED
    # the chunks a reader followed: numbered objects under the claim's stream, each a JSON list of values
    chunks = [k for k in pool.store.keys(f"s3://{pool.bucket}/{pool.store.base}/runs/") if "/streams/" in k]
    assert chunks and all(k.rsplit("/", 1)[-1].startswith("chunk-") for k in chunks)
    first = min(k for k in chunks if k.endswith("/0/chunk-000001.json"))
    assert isinstance(json.loads(pool.store.get(f"s3://{pool.bucket}/{first}") or b""), list)


def test_remote_on_a_generator_method_says_to_use_remote_gen(capsys, tmp_path) -> None:
    script = tmp_path / "gen.py"
    script.write_text(
        "import modal\napp = modal.App()\n\n@app.cls()\nclass G:\n    @modal.method()\n    def g(self):\n"
        "        yield 1\n\n@app.local_entrypoint()\ndef main():\n    G().g.remote()\n"
    )
    code, _, err = _cli(capsys, ["run", "--local", str(script)])
    assert code == 1 and "G.g is a generator method: call it with .remote_gen(...)" in err
