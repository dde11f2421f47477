"""calque's own configuration files are named ``.yaml``; the two that were ``.yml`` (the pool spec on a
worker host, ``calque run``'s mapping file) are still read under the old name for one release, warning.
Read through the real readers (``load_spec``, ``PoolMap``) on real files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from calque.confignames import LAST_RELEASE_READING_OLD_NAMES, config_path
from calque.pool.spec import load_spec
from calque.run.pool_mapping import PoolMap


def _write_spec(path: Path, model: str) -> Path:
    doc = {"model": model, "workload": "s3://lab-runs/k/embedder.py::Embedder", "bucket": "lab-runs"}
    path.write_text(yaml.safe_dump(doc))
    return path


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "calque.confignames"]


def test_the_new_name_is_read_silently(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    new = _write_spec(tmp_path / "pool.yaml", "lab/new")
    with caplog.at_level(logging.WARNING):
        assert load_spec(new).model == "lab/new"
    assert _warnings(caplog) == []


def test_the_old_name_alone_is_read_with_a_warning_to_rename_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = _write_spec(tmp_path / "pool.yml", "lab/old")
    with caplog.at_level(logging.WARNING):
        assert load_spec(tmp_path / "pool.yaml").model == "lab/old"  # asked for by its new name
    (warned,) = _warnings(caplog)
    assert f"pool spec {old}: read under its old name: rename it pool.yaml" in warned
    assert f"calque {LAST_RELEASE_READING_OLD_NAMES} is the last release" in warned


def test_with_both_names_the_new_one_wins_and_the_old_one_is_named_as_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = _write_spec(tmp_path / "pool.yml", "lab/old")
    new = _write_spec(tmp_path / "pool.yaml", "lab/new")
    with caplog.at_level(logging.WARNING):
        assert load_spec(new).model == "lab/new"
    (warned,) = _warnings(caplog)
    assert f"pool spec {old}: ignored: {new} is read instead; remove {old}" in warned
    assert old.read_text() and new.read_text()  # nothing is moved or deleted: the person decides


def test_the_old_host_path_asked_for_by_name_warns_and_a_name_the_user_chose_does_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert config_path(Path("/etc/calque/pool.yml"), "pool spec") == Path("/etc/calque/pool.yml")
    (warned,) = _warnings(caplog)
    assert "calque's name for it is now /etc/calque/pool.yaml: rename it" in warned
    caplog.clear()
    chosen = _write_spec(tmp_path / "lab-a-pool-spec.yml", "lab/chosen")
    mine = _write_spec(tmp_path / "pool.yml", "lab/mine")  # a pool.yml of the user's own, asked for by name
    with caplog.at_level(logging.WARNING):
        assert load_spec(chosen).model == "lab/chosen" and load_spec(mine).model == "lab/mine"
    assert _warnings(caplog) == []


def test_calque_run_reads_calque_run_yaml_and_the_old_calque_run_yml_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    script = tmp_path / "app.py"
    script.write_text("")
    (tmp_path / "calque-run.yml").write_text(yaml.safe_dump({"pools": {"Old": "old-spec.yaml"}}))
    with caplog.at_level(logging.WARNING):
        old = PoolMap(script)
    assert old.mapping == {"Old": [tmp_path / "old-spec.yaml"]} and old.pools_file == tmp_path / "calque-run.yml"
    assert "read under its old name: rename it calque-run.yaml" in _warnings(caplog)[0]
    caplog.clear()
    (tmp_path / "calque-run.yml").unlink()
    (tmp_path / "calque-run.yaml").write_text(yaml.safe_dump({"pools": {"New": "new-spec.yaml"}}))
    with caplog.at_level(logging.WARNING):
        new = PoolMap(script)
    assert new.mapping == {"New": [tmp_path / "new-spec.yaml"]} and _warnings(caplog) == []
