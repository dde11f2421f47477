"""``calque.ops.pool_spec`` check mode predicts the real run on every runtime path, against moto.

The paths: the wheel and a wheelhouse built now (the default), a reused built wheel, a reused
wheelhouse directory, the wheel alone, and an explicit pip requirement. On each, check mode's
user-data has the real run's config digest (the digest the pool's launch template is keyed by:
URLs count without their signatures), and it reports a change exactly when the real run makes one.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from calque.aws.acquire.template import config_digest
from calque.aws.clients import client
from calque.ops.pool_spec import PoolSpecOp
from calque.packaging import build_wheel, build_wheelhouse

pytestmark = pytest.mark.slow
BUCKET = "spec-check-runs"
SPEC = {"model": "org/m", "pool": "lab-a/m", "workload": "s3://spec-check-runs/w.py::M", "bucket": BUCKET}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """This calque's wheel and a wheelhouse around it, built once for the module."""
    root = tmp_path_factory.mktemp("built")
    wheel = build_wheel(root / "wheel")
    house = build_wheelhouse(root / "house", wheel=wheel).path
    yield {"wheel": wheel, "house": house}
    shutil.rmtree(root, ignore_errors=True)


def digest(user_data: str) -> str:
    return config_digest({}, user_data)


PATHS: dict[str, dict[str, Any]] = {
    "default (build the wheel and the wheelhouse)": {},
    "reused wheel, wheelhouse built": {"runtime_wheel": "wheel"},
    "reused wheel and wheelhouse": {"runtime_wheel": "wheel", "runtime_wheelhouse_dir": "house"},
    "the wheel alone": {"runtime_wheelhouse": False},
    "pip override": {"runtime_pip": "calque==0.1.0"},
}


@pytest.mark.parametrize("path", list(PATHS))
def test_check_mode_predicts_the_real_run(moto: str, built: dict[str, Path], tmp_path: Path, path: str) -> None:
    client("s3").create_bucket(Bucket=BUCKET)
    params = {
        k: str(built[v]) if k in ("runtime_wheel", "runtime_wheelhouse_dir") else v for k, v in PATHS[path].items()
    }
    op = PoolSpecOp()
    request = op.request({"spec": SPEC, "path": str(tmp_path / "pool.yml"), "runtime_ttl": "1h", **params})

    # from nothing: check mode says what the real run does
    check = op.run(request, check_mode=True)
    assert not (tmp_path / "pool.yml").exists() and client("s3").list_objects_v2(Bucket=BUCKET)["KeyCount"] == 0
    real = op.run(request)
    assert check.changed and real.changed
    assert check.actions == real.actions
    unknown = (
        check.result.runtime is not None
        and check.result.runtime.wheelhouse_url
        and (check.result.runtime.wheelhouse_sha256 is None)
    )
    if unknown:  # a wheelhouse to build around a new wheel: its sha256 comes only with the real run
        assert path.startswith(("default", "reused wheel, wheelhouse built"))
    else:
        assert digest(check.result.user_data) == digest(real.result.user_data)

    # unchanged: nothing to do, and the same digest (only the URLs' signatures differ)
    check = op.run(request, check_mode=True)
    again = op.run(request)
    assert not check.changed and not again.changed
    assert digest(check.result.user_data) == digest(again.result.user_data) == digest(real.result.user_data)
    assert check.before == check.after  # --diff shows nothing
