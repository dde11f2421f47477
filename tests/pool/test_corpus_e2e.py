"""Every corpus script through `calque pool submit` -> a real worker process -> `calque pool results`."""

from __future__ import annotations

import json
import os

import pytest
from calque.cli.main import run

from pool.conftest import PROC_WAIT, Pool, WorkerProc, wait_until
from pool.corpus_cases import CASES, Case

# every corpus worker starts at once: on a 2-core box their start-ups (imports, @enter) queue up
CORPUS_WAIT = "180"

pytestmark = pytest.mark.slow


def _cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_every_corpus_script_runs_unchanged_on_a_worker(make_pool, capsys, tmp_path) -> None:
    os.environ["CALQUE_POOL_BUCKET"] = "calque-test-bucket"
    started: list[tuple[Case, Pool, WorkerProc]] = []
    for n, case in enumerate(CASES):
        pool = make_pool(workload=case.path, model=f"corpus/{n}-{case.script}", parameters=case.parameters)
        started.append((case, pool, pool.start()))
    try:
        for case, pool, worker in started:
            if case.load_error:
                assert worker.proc.wait(timeout=float(CORPUS_WAIT)) != 0
                assert case.load_error in worker.stderr(), worker.stderr()
                continue
            items = tmp_path / f"{pool.model.replace('/', '_')}.jsonl"
            items.write_text("".join(json.dumps(x) + "\n" for x in case.items))
            code, out, err = _cli(capsys, ["pool", "submit", "--model", pool.model, "--items", str(items),
                                           "--method", case.method, "--timeout", CORPUS_WAIT, "--json"])  # fmt: skip
            failures = sum(1 for e in case.expected if isinstance(e, tuple))
            assert code == (1 if failures else 0), (case.script, out, err, worker.stderr())
            report = json.loads(out)
            assert report["items_ok"] == len(case.items) - failures and report["items_failed"] == failures
            assert report["finished"] and report["enter_seconds_paid"] > 0
            code, out, _ = _cli(capsys, ["pool", "results", report["run_id"], "--model", pool.model])
            assert code == 0
            got = [json.loads(line) for line in out.splitlines()]
            assert [g["index"] for g in got] == list(range(len(case.items)))
            for g, want in zip(got, case.expected, strict=True):
                if isinstance(want, tuple):
                    assert not g["ok"] and g["error"]["type"] == want[1] and "Traceback" in g["error"]["traceback"]
                else:
                    assert g["ok"] and g["value"] == want, (case.script, g)
            if failures:
                code, out, _ = _cli(capsys, ["pool", "results", report["run_id"], "--model", pool.model, "--failed"])
                assert len(out.splitlines()) == failures
    finally:
        os.environ.pop("CALQUE_POOL_BUCKET", None)
    exit_hook = next((p, w) for c, p, w in started if c.script == "exit_hook.py")
    exit_hook[0].stop_all()
    assert "EXIT-HOOK-RAN seen=3" in exit_hook[1].stdout()
    dunder = next(w for c, _, w in started if c.script == "dunder_lifecycle.py")
    dunder.proc.terminate()
    wait_until(lambda: "DUNDER-EXIT-RAN" in dunder.stdout(), PROC_WAIT, "__exit__ to run")


def test_submit_to_a_missing_pool_names_the_queue(moto, capsys, tmp_path) -> None:
    items = tmp_path / "i.jsonl"
    items.write_text("1\n")
    code, _, err = _cli(capsys, ["pool", "submit", "--model", "nobody/here", "--items", str(items),
                                 "--bucket", "b", "--no-wait"])  # fmt: skip
    assert code == 3
    assert "looked for SQS queue 'calque-pool-nobody-here-" in err


def test_submit_rejects_a_bad_items_file_with_its_line(moto, capsys, tmp_path) -> None:
    items = tmp_path / "i.jsonl"
    items.write_text('1\n{"args": [2]}\nnot json\n')
    code, _, err = _cli(capsys, ["pool", "submit", "--model", "m", "--items", str(items), "--bucket", "b"])
    assert code == 2 and "line 3 is not JSON" in err
