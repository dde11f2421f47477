"""The warm supervisor in-process: every corpus script, lifecycle order, batching, concurrency, limits."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from calque.models import Item
from calque.warm import EnterError, WarmSupervisor, WorkloadError

from pool.corpus_cases import CASES, CORPUS, Case, as_item_args


def _items(case: Case) -> list[Item]:
    out = []
    for i, line in enumerate(case.items):
        args, kwargs = as_item_args(line)
        out.append(Item(index=i, args=args, kwargs=kwargs))
    return out


def check_results(case: Case, results: list) -> None:
    assert [r.index for r in results] == list(range(len(case.expected)))
    for r, want in zip(results, case.expected, strict=True):
        if isinstance(want, tuple) and want[0] == "error":
            assert not r.ok and r.error is not None
            assert r.error.type == want[1]
            assert "Traceback" in r.error.traceback
        else:
            assert r.ok, r.error
            assert r.value == want


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.script}:{c.method or 'load'}")
def test_corpus_script_runs_in_process(case: Case) -> None:
    target = str(case.path)
    if case.load_error:
        with pytest.raises((WorkloadError, EnterError)) as info:
            WarmSupervisor.load(target, case.parameters)
        assert case.load_error in str(info.value)
        assert isinstance(info.value, EnterError) == case.enter_error
        return
    sup = WarmSupervisor.load(target, case.parameters)
    try:
        assert sup.enter_count == 1
        check_results(case, sup.run(case.method, _items(case)))
        # a second batch on the same warm instance: no second enter
        if case.script != "exit_hook.py":  # stateful: its values count up
            check_results(case, sup.run(case.method, _items(case)))
    finally:
        sup.close()
    assert sup.enter_count == 1


def test_concurrent_class_runs_items_at_once() -> None:
    with WarmSupervisor.load(str(CORPUS / "concurrent_class.py")) as sup:
        sup.run("fetch", [Item(index=i, args=[i]) for i in range(8)])
        (peak,) = sup.run("observed_peak", [Item(index=0)])
    assert peak.value == 4


def test_stand_in_modal_is_only_in_the_worker_process() -> None:
    code = "import importlib.util, sys; print(importlib.util.find_spec('modal') is None)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


def _script(tmp_path: Path, body: str) -> str:
    p = tmp_path / "w.py"
    p.write_text("import modal, time\napp = modal.App('t')\n" + textwrap.dedent(body))
    return str(p)


def test_item_timeout_fails_the_item_and_the_next_items_still_run(tmp_path: Path) -> None:
    target = _script(
        tmp_path,
        """
        @app.cls()
        class M:
            @modal.method()
            def f(self, s):
                time.sleep(s)
                return s
        """,
    )
    sup = WarmSupervisor.load(target, item_timeout_s=0.5)
    res = sup.run("f", [Item(index=0, args=[3]), Item(index=1, args=[0])])
    sup.close()
    assert not res[0].ok and res[0].error is not None and res[0].error.type == "TimeoutError"
    assert res[1].ok and res[1].value == 0


def test_claim_deadline_fails_the_unfinished_items(tmp_path: Path) -> None:
    target = _script(
        tmp_path,
        """
        @app.cls()
        class M:
            @modal.method()
            def f(self, s):
                time.sleep(s)
                return s
        """,
    )
    # the first item is instant and the rest 2 s each: the first is done well before the deadline
    # however loaded the box, and the last cannot be
    sup = WarmSupervisor.load(target, claim_deadline_s=1.0)
    drain = sup.drain("f", [Item(index=i, args=[0.0 if i == 0 else 2.0]) for i in range(5)])
    sup.close()
    assert drain.stopped == "deadline" and drain.error
    assert [r.index for r in drain.results] == list(range(5))
    assert drain.results[0].ok
    assert not drain.results[-1].ok


def test_batched_method_returning_wrong_length_fails_its_items(tmp_path: Path) -> None:
    target = _script(
        tmp_path,
        """
        @app.cls()
        class M:
            @modal.batched(max_batch_size=3)
            def f(self, xs):
                return xs[:1]
        """,
    )
    with WarmSupervisor.load(target) as sup:
        res = sup.run("f", [Item(index=i, args=[i]) for i in range(3)])
    assert all(not r.ok and "returned 1 values for 3 inputs" in r.error.message for r in res if r.error)


def test_unknown_decorator_kwarg_is_refused_with_its_line(tmp_path: Path) -> None:
    target = _script(
        tmp_path,
        """
        @app.cls(gpus="A100")
        class M:
            @modal.method()
            def f(self, x):
                return x
        """,
    )
    with pytest.raises(WorkloadError, match=r"w.py line 4: @app.cls got keyword argument\(s\) gpus"):
        WarmSupervisor.load(target)


def test_missing_parameter_is_refused_naming_it() -> None:
    with pytest.raises(WorkloadError, match=r"Greeter\.repeat = modal\.parameter"):
        WarmSupervisor.load(str(CORPUS / "parameterised.py"))


def test_exit_hook_runs_once_on_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "marker"
    monkeypatch.setenv("CALQUE_TEST_EXIT_MARKER", str(marker))
    sup = WarmSupervisor.load(str(CORPUS / "exit_hook.py"))
    sup.run("count", [Item(index=0, args=["x"])])
    sup.close()
    sup.close()
    assert marker.read_text() == "exit seen=1\n"


def test_non_json_result_fails_the_item(tmp_path: Path) -> None:
    target = _script(
        tmp_path,
        """
        @app.function()
        def f(x):
            return object()
        """,
    )
    with WarmSupervisor.load(target) as sup:
        (r,) = sup.run("f", [Item(index=0, args=[1])])
    assert not r.ok and r.error is not None and "not JSON-serialisable" in r.error.message
    json.loads(r.model_dump_json())


def test_a_modal_submodule_is_refused_by_name(tmp_path: Path) -> None:
    p = tmp_path / "sub.py"
    p.write_text("import modal\nimport modal.experimental\n")
    with pytest.raises(WorkloadError, match=r"sub.py line 2: modal.experimental is not supported"):
        WarmSupervisor.load(str(p))


def test_using_an_inert_modal_dict_fails_the_item_naming_it(tmp_path: Path) -> None:
    target = _script(
        tmp_path,
        """
        cache = modal.Dict.from_name("cache", create_if_missing=True)

        @app.function()
        def f(x):
            return cache[x]
        """,
    )
    with WarmSupervisor.load(target) as sup:
        (r,) = sup.run("f", [Item(index=0, args=["k"])])
    assert not r.ok and r.error is not None
    assert "modal.Dict is not available on a calque worker (w.py line 8)" in r.error.message
