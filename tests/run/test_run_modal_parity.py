"""Issue 21's failures, one corpus script each: run with --local and on a pool whose workload is staged
to S3 the way playbooks/pool.yml stages it (``stage_workload``), with real workers on moto.

Each script prints what a Modal user would check; the pool run must print exactly what --local
prints, and both must print what Modal would (the assertions on the text).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from calque.aws.clients import client
from calque.aws.naming import pool_queue_name
from calque.cli.main import run
from calque.pool.bootstrap import stage_workload
from pool.conftest import make_pool  # noqa: F401  (the fixture: a queue, a bucket and real workers)

CORPUS = Path(__file__).resolve().parent / "corpus"
BUCKET = "calque-test-bucket"
RUN_WAIT = "180"

pytestmark = pytest.mark.slow


def _cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(args)
    out, err = capsys.readouterr()
    return code, out, err


def _staged_pool(make_pool: Any, script: str, target: str = "", model: str = "", **spec: Any) -> Any:  # noqa: F811
    """A pool serving ``script`` (``::target``) from its S3-staged copy, as pool.yml makes one."""
    model = model or f"parity/{script.removesuffix('.py').replace('_', '-')}"
    s3 = client("s3")
    if BUCKET not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
        s3.create_bucket(Bucket=BUCKET)
    workload = str(CORPUS / script) + (f"::{target}" if target else "")
    uri = stage_workload(s3, BUCKET, "calque", pool_queue_name(model), workload)
    assert uri.startswith("s3://"), uri
    return make_pool(workload=uri, model=model, **spec)


@pytest.fixture
def pools(make_pool: Any, tmp_path: Path) -> dict[str, tuple[Path, Any]]:  # noqa: F811
    """Every script's pool, started together; the spec file and the worker of each."""
    made = {
        "returns_bytes.py": _staged_pool(make_pool, "returns_bytes.py"),
        "own_exception.py": _staged_pool(make_pool, "own_exception.py"),
        "parameters.py": _staged_pool(
            make_pool, "parameters.py", "Translator", parameters={"lang": "fr", "formal": True, "max_words": 3}
        ),
        "value_types.py": _staged_pool(make_pool, "value_types.py"),
        "modal_args.py": _staged_pool(make_pool, "modal_args.py"),
        "missing_calls.py": _staged_pool(make_pool, "missing_calls.py", batch_size=2),
        "local_timing.py": _staged_pool(make_pool, "local_timing.py"),
    }
    out = {name: (p.write_spec(), p.start()) for name, p in made.items()}
    for _, worker in out.values():
        worker.wait_log("serving", timeout=float(RUN_WAIT))
    return out


def _both(capsys: Any, pools: dict[str, tuple[Path, Any]], script: str, *args: str,
          entry: str = "", local_args: tuple[str, ...] | None = None) -> str:  # fmt: skip
    spec, worker = pools[script]
    path = str(CORPUS / script) + (f"::{entry}" if entry else "")
    code, local_out, local_err = _cli(capsys, ["run", "--local", path, *(args if local_args is None else local_args)])
    assert code == 0, (script, local_out, local_err)
    code, pool_out, pool_err = _cli(capsys, ["run", "--pool", str(spec), "--timeout", RUN_WAIT, path, *args])
    assert code == 0, (script, pool_out, pool_err, worker.stderr())
    assert pool_out == local_out, script
    assert "on pool parity/" in pool_err, pool_err
    return pool_out


def test_issue_21_scripts_print_on_an_s3_staged_pool_what_they_print_locally(pools, capsys) -> None:
    # bytes travel; a value nothing carries fails its item with a TypeError; the worker keeps serving
    out = _both(capsys, pools, "returns_bytes.py")
    assert out.splitlines()[0] == "bytes 12 b'\\xfa\\xfb\\xfc'", out
    assert "TypeError: the value handle returned: a value of type object cannot travel" in out, out
    assert out.splitlines()[-1] == "after [6, 12, 18]", out
    assert pools["returns_bytes.py"][1].proc.poll() is None, "the worker must survive what a method returns"

    # the script's own exception class comes back as itself, as builtins do
    out = _both(capsys, pools, "own_exception.py")
    assert "caught QuotaExceeded: 50 is over the lab's quota of 10 True" in out, out
    assert "caught KeyError: 'negative'" in out, out
    assert out.splitlines()[-1] == "['int', 'QuotaExceeded'] True", out

    # the pool's parameter set, passed in full, runs; the class's defaults (which differ) are refused
    out = _both(capsys, pools, "parameters.py", "--lang", "fr", "--formal", "--max-words", "3")
    assert out == "fr True 3 -> bonjour Ada\n", out
    spec, _ = pools["parameters.py"]
    code, out, err = _cli(capsys, ["run", "--pool", str(spec), str(CORPUS / "parameters.py")])
    assert code == 2 and out == "", (out, err)
    assert "lang: this call 'en' (its default), the pool 'fr'" in err, err
    assert "formal: this call False (its default), the pool True" in err, err
    assert "max_words: this call 5 (its default), the pool 3" in err and "Nothing was sent" in err, err

    # every type round-trips, NaN and the infinities too; an object is refused at the call
    out = _both(capsys, pools, "value_types.py")
    lines = out.splitlines()
    assert lines[0] == (
        "True ['Decimal', 'bytes', 'date', 'datetime', 'frozenset', 'list', 'set', 'str', 'str', 'str', 'time', "
        "'tuple']"
    ), out
    assert lines[1] == "[\"'$calque'\", \"'at'\", \"'blob'\", \"'day'\", \"'frozen'\", \"'ids'\", \"'nested'\", " \
        "\"'pair'\", \"'price'\", \"'when'\", '(2, 3)', '1']", out  # fmt: skip
    assert lines[2:5] == ["True [inf, -inf]", "2027-01-01 01:00:00", "set ['bytes', 'float', 'int'] (2,)"], out
    assert lines[5].startswith("TypeError at the call: an argument of echo: a value of type object cannot travel")

    # Optional[int], str | None, Literal and unannotated parameters as modal run reads them; *args takes it all
    out = _both(capsys, pools, "modal_args.py", "--seed", "7", "--label", "x", "--mode", "slow", "--level", "2",
                "--note", "3", entry="main")  # fmt: skip
    assert out == (
        "[('label', 'str', 'x'), ('level', 'int', 2), ('mode', 'str', 'slow'), ('note', 'str', '3'), "
        "('seed', 'int', 7)]\n"
    ), out
    out = _both(capsys, pools, "modal_args.py", "alpha", "2", "--beta", "--gamma=1", entry="words")
    assert out == "[('argv', 'tuple', ('alpha', '2', '--beta', '--gamma=1'))]\n", out

    # FunctionCall.gather and from_id, .spawn_map returning once its inputs are sent; is_local() False remotely
    out = _both(capsys, pools, "missing_calls.py", entry="main")
    assert out == ("gathered [0, 1, 4, 9]\nfrom_id 4 True\nspawn_map None\nis_local here True remotely False\n"), out
    spec, _ = pools["missing_calls.py"]
    script = str(CORPUS / "missing_calls.py")
    code, out, err = _cli(capsys, ["run", "--pool", str(spec), f"{script}::spawn_only"])
    assert code == 0, err
    call_id = re.fullmatch(r"call (\S+)\n", out)
    assert call_id, out
    # another run (another process, as Modal's from_id is used) finds the call by its id on the pool
    code, out, err = _cli(capsys, ["run", "--pool", str(spec), "--timeout", RUN_WAIT, f"{script}::fetch",
                                   "--call-id", call_id.group(1)])  # fmt: skip
    assert (code, out) == (0, "fetched 81\n"), err
    code, _, err = _cli(capsys, ["run", "--local", f"{script}::fetch", "--call-id", call_id.group(1)])
    assert code == 2 and "under --local a call lives only in the run that spawned it" in err, err

    # --local: remote code is not local, and .map/.starmap/.for_each return with their last result
    out = _both(capsys, pools, "local_timing.py", "--budget", "30", local_args=("--budget", "0.5"))
    assert out == "remote code is local: False [True]\nslower than the budget: []\n", out


def test_calque_run_yml_routes_each_parameter_set_to_the_pool_of_that_set(make_pool, capsys, tmp_path) -> None:  # noqa: F811
    script = "parameter_routing.py"
    plain = _staged_pool(make_pool, script, "Translator", model="parity/routing-en")
    french = _staged_pool(make_pool, script, "Translator", model="parity/routing-fr",
                          parameters={"lang": "fr", "formal": True})  # fmt: skip
    specs = [plain.write_spec(), french.write_spec()]
    for w in (plain.start(), french.start()):
        w.wait_log("serving", timeout=float(RUN_WAIT))
    pools_file = tmp_path / "calque-run.yml"
    pools_file.write_text(f"version: 1\npools:\n  Translator: [{specs[0]}, {specs[1]}]\n")
    path = str(CORPUS / script)
    code, local_out, err = _cli(capsys, ["run", "--local", f"{path}::main"])
    assert code == 0, err
    assert local_out == "hello Ada | bonjour Ada\n['bonjour Bo', 'bonjour Cy'] ['hello Di']\n", local_out
    code, out, err = _cli(capsys, ["run", "--pools", str(pools_file), "--timeout", RUN_WAIT, f"{path}::main"])
    assert (code, out) == (0, local_out), err  # each worker runs its own set: the values say which pool ran
    assert "on pools parity/routing-en, parity/routing-fr" in err, err
    # a set no pool runs is refused before anything is sent, with each pool's differing fields
    code, out, err = _cli(capsys, ["run", "--pools", str(pools_file), f"{path}::formal_english"])
    assert code == 2 and out == "", (out, err)
    assert (
        f"the pool of {specs[0]} runs Translator with other parameters: formal: this call True, the pool False" in err
    )
    assert (
        f"the pool of {specs[1]} runs Translator with other parameters: lang: this call 'en' (its default), "
        "the pool 'fr'" in err
    ), err
    assert "Nothing was sent" in err, err
    code, out, err = _cli(capsys, ["run", "--local", f"{path}::formal_english"])
    assert (code, out) == (0, "good day Ed\n"), err


def test_an_entrypoint_annotation_modal_run_refuses_is_refused(capsys, tmp_path: Path) -> None:
    script = tmp_path / "enum_arg.py"
    script.write_text(
        "import enum\nimport modal\napp = modal.App()\n\nclass Color(enum.Enum):\n    RED = 'red'\n\n"
        "@app.local_entrypoint()\ndef main(color: Color = Color.RED, sizes: list[int] | None = None):\n"
        "    print(color)\n"
    )
    code, _, err = _cli(capsys, ["run", "--local", str(script)])
    assert code == 2 and "parameter color has an annotation modal run cannot parse" in err, err
    script.write_text(
        "import modal\napp = modal.App()\n\n@app.local_entrypoint()\ndef main(first: str, *rest):\n    print(rest)\n"
    )
    code, _, err = _cli(capsys, ["run", "--local", str(script)])
    assert code == 2 and "a function with *rest can have no other parameters" in err, err
    code, _, err = _cli(capsys, ["run", "--local", str(CORPUS / "modal_args.py::main"), "--mode", "medium"])
    assert code == 2 and "'medium' is not one of 'fast', 'slow'" in err, err


def test_an_unknown_or_missing_parameter_is_a_type_error_at_the_class_call(capsys, tmp_path: Path) -> None:
    """docs/modal-compat.md: an unknown parameter, or a missing one with no default, fails at ``Model(...)``."""
    script = tmp_path / "params.py"
    script.write_text(
        "import modal\napp = modal.App()\n\n@app.cls()\nclass Model:\n"
        "    size: int = modal.parameter()\n    lang: str = modal.parameter(default='en')\n\n"
        "    @modal.method()\n    def f(self) -> str:\n        return f'{self.size} {self.lang}'\n\n"
        "@app.local_entrypoint()\ndef main():\n"
        "    for make in (lambda: Model(size=1, language='fr'), lambda: Model(lang='fr')):\n"
        "        try:\n            make()\n        except TypeError as exc:\n            print('TypeError', exc)\n"
        "    print(Model(size=3).f.remote())\n"
    )
    code, out, err = _cli(capsys, ["run", "--local", str(script)])
    assert code == 0, err
    assert out.splitlines() == [
        "TypeError Model() got unknown parameter(s) ['language'] (it declares ['lang', 'size'])",
        "TypeError Model() needs parameter(s) ['size']: modal.parameter() without a default",
        "3 en",
    ], out


def test_a_datetime_entrypoint_argument_arrives_as_a_datetime(capsys, tmp_path: Path) -> None:
    """docs/modal-compat.md's argument table: ``x: datetime.datetime`` is ``--x VALUE``, converted as modal run does."""
    script = tmp_path / "day.py"
    script.write_text(
        "import datetime\nimport modal\napp = modal.App()\n\n@app.local_entrypoint()\n"
        "def main(day: datetime.datetime):\n    print(type(day).__name__, day + datetime.timedelta(days=1))\n"
    )
    code, out, err = _cli(capsys, ["run", "--local", str(script), "--day", "2026-12-02"])
    assert (code, out) == (0, "datetime 2026-12-03 00:00:00\n"), err
    code, _, err = _cli(capsys, ["run", "--local", str(script), "--day", "tomorrow"])
    assert code == 2 and "'tomorrow' does not match the formats" in err, err
