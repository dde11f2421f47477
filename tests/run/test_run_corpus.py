"""`calque run` on a corpus of Modal scripts: on pools (moto, real workers) it prints what `--local` prints."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from calque.cli.main import run
from pool.conftest import make_pool  # noqa: F401  (the fixture: a queue, a bucket and real workers)

CORPUS = Path(__file__).resolve().parent / "corpus"
# script (::entrypoint) and its arguments; every one runs on the same two pools
CASES: list[tuple[str, list[str]]] = [
    ("remote_loop.py", []),
    ("map_list.py", []),
    ("map_generator.py", ["--n", "37"]),
    ("starmap.py", []),
    ("spawn_get.py", []),
    ("exceptions.py", []),
    ("async_entry.py", []),
    ("typed_args.py", ["--text", "ab", "--repeat", "3", "--factor", "2.5", "--loud", "--max-items", "9"]),
]
RUN_WAIT = "180"

pytestmark = pytest.mark.slow


def _cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_every_corpus_script_prints_the_same_on_pools_as_locally(make_pool, capsys, tmp_path) -> None:  # noqa: F811
    model_pool = make_pool(workload=f"{CORPUS / 'remote_loop.py'}::Model", model="run-corpus/model", batch_size=10)
    func_pool = make_pool(workload=f"{CORPUS / 'exceptions.py'}::square", model="run-corpus/square", batch_size=2)
    workers = [model_pool.start(), func_pool.start()]
    pools_file = tmp_path / "calque-run.yml"
    pools_file.write_text(yaml.safe_dump({"version": 1, "pools": {
        "Model": str(model_pool.write_spec()), "square": str(func_pool.write_spec())}}))  # fmt: skip
    for w in workers:
        w.wait_log("serving", timeout=float(RUN_WAIT))
    for script, args in CASES:
        path = str(CORPUS / script)
        code, local_out, local_err = _cli(capsys, ["run", "--local", path, *args])
        assert code == 0, (script, local_out, local_err)
        assert local_out.strip(), script
        code, pool_out, pool_err = _cli(capsys, ["run", "--pools", str(pools_file), "--timeout", RUN_WAIT, path, *args])
        assert code == 0, (script, pool_out, pool_err, [w.stderr() for w in workers])
        assert pool_out == local_out, script
        # the closing lines: served by the pools, with the warm-hit count and the cost line
        assert "on pool run-corpus/" in pool_err and ", warm hits " in pool_err and "cost:" in pool_err, pool_err
        assert "(0 failed)" in pool_err or script == "exceptions.py", pool_err
    # each worker entered once and served every script's calls warm
    for w in workers:
        assert "enter count 1" in w.stderr() and "enter count 2" not in w.stderr()


def test_a_class_with_no_pool_says_how_to_create_one(moto, capsys) -> None:
    code, _, err = _cli(capsys, ["run", str(CORPUS / "remote_loop.py")])
    assert code == 2
    assert "no pool serves class Model of remote_loop.py" in err
    assert f"calque_pool_workload: {CORPUS / 'remote_loop.py'}::Model" in err and "playbooks/pool.yml" in err
    assert "calque run --local remote_loop.py" in err


def test_a_failing_entrypoint_exits_1_with_its_exception(capsys, tmp_path) -> None:
    script = tmp_path / "boom.py"
    script.write_text(
        "import modal\napp = modal.App()\n\n@app.function()\ndef f(x):\n    raise KeyError(x)\n\n"
        "@app.local_entrypoint()\ndef main():\n    print('before')\n    f.remote('k')\n"
    )
    code, out, err = _cli(capsys, ["run", "--local", str(script)])
    assert code == 1 and out == "before\n"
    assert "the local entrypoint main raised KeyError: 'k'" in err and "raise KeyError(x)" in err


def test_bad_entrypoint_arguments_are_usage_errors(capsys) -> None:
    code, _, err = _cli(capsys, ["run", "--local", str(CORPUS / "typed_args.py"), "--text", "ab", "--repeat", "x"])
    assert code == 2 and "'x' is not a valid integer" in err
    code, _, err = _cli(capsys, ["run", "--local", str(CORPUS / "typed_args.py")])
    assert code == 2 and "Missing option '--text'" in err


def test_entrypoint_arguments_follow_the_signature(capsys) -> None:
    code, out, _ = _cli(capsys, ["run", "--local", str(CORPUS / "typed_args.py"), "--text", "hi", "--no-loud"])
    assert code == 0
    assert out == "{'text': 'hihi', 'length': 4} 2.0 int 3\n"
