"""Every file a person writes fails the same way: a UsageError naming the file, the field and the problem."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from calque.errors import UsageError
from calque.gpu.hostconfig import load_gpu_config
from calque.gpu.layout import load_layout
from calque.pool.spec import load_spec

LOADERS: dict[str, tuple[Callable[[Path], Any], str, str]] = {
    # name: (loader, a document with one bad field, the field the message must name)
    "pool spec": (load_spec, "model: m\nworkload: w.py\nbucket: bkt\nbatch_size: 0\n", "batch_size"),
    "layout file": (load_layout, "version: 1\nmig-configs:\n  a:\n    - mig-enabled: maybe\n", "mig-enabled"),
    "host configuration": (load_gpu_config, "gpu:\n  backend: quantum\n", "backend"),
}


@pytest.mark.parametrize("what", LOADERS)
def test_bad_field_names_file_and_field(what: str, tmp_path: Path) -> None:
    load, text, field = LOADERS[what]
    f = tmp_path / "file.yaml"
    f.write_text(text)
    with pytest.raises(UsageError) as err:
        load(f)
    assert str(f) in str(err.value) and field in str(err.value)


@pytest.mark.parametrize("what", LOADERS)
@pytest.mark.parametrize(
    "text,problem",
    [("a: [unclosed\n", "not valid YAML"), ("- just\n- a list\n", "must be a mapping")],
)
def test_unreadable_documents_say_why(what: str, text: str, problem: str, tmp_path: Path) -> None:
    load = LOADERS[what][0]
    f = tmp_path / "file.yaml"
    f.write_text(text)
    with pytest.raises(UsageError, match=problem):
        load(f)


@pytest.mark.parametrize("what", LOADERS)
def test_missing_file_says_so(what: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        LOADERS[what][0](tmp_path / "absent.yaml")
