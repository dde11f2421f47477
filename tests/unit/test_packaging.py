"""The runtime's packaging: a reproducible setuptools wheel of only package files, and a pinned wheelhouse
that installs with no index (the contract the Ansible ``runtime`` role and pool instances rely on)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from calque import __version__
from calque.packaging import build_wheel, build_wheelhouse, notebooks_pins, runtime_pins, wheel_name
from calque.packaging.wheel import source_root

REPO = Path(__file__).resolve().parents[2]


def test_shipped_runtime_constraints_agree_with_constraints_txt() -> None:
    proc = subprocess.run(
        [str(REPO / "scripts" / "gen-runtime-constraints"), "--check"],
        capture_output=True,
        text=True,
        env={**os.environ, "CALQUE_VENV_PYTHON": sys.executable},
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pins = runtime_pins()
    assert pins["prometheus_client"] and pins["pydantic"] == _constraint("pydantic")
    assert "pytest" not in pins and "ansible-core" not in pins  # the runtime's closure, not dev tools


def _constraint(name: str) -> str:
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.split("==")[0] == name:
            return line.split("==")[1]
    raise AssertionError(f"{name} not in constraints.txt")


def _source_with_leftovers(tmp: Path) -> Path:
    """A copy of the sources whose package holds an editor backup and a swap file, as a checkout may."""
    root = source_root()
    src = tmp / "src"
    shutil.copytree(
        root / "runtime" / "calque", src / "runtime" / "calque", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(root / name, src / name)
    (src / "runtime" / "calque" / "pool" / "worker.py~").write_text("# an editor backup\n")
    (src / "runtime" / "calque" / "session" / "systemd" / ".unit.swp").write_bytes(b"\0swap")
    return src


@pytest.mark.slow
def test_wheel_is_byte_identical_across_builds_and_holds_only_package_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    src = _source_with_leftovers(tmp_path)
    first = build_wheel(tmp_path / "one", source=src, cached=False)
    os.utime(src / "runtime" / "calque" / "errors.py")  # a touched file: same content, same wheel
    second = build_wheel(tmp_path / "two", source=src, cached=False)
    assert first.name == second.name == wheel_name()
    assert first.read_bytes() == second.read_bytes()
    names = zipfile.ZipFile(first).namelist()
    assert "calque/pool/worker/loop.py" in names and "calque/data/runtime-constraints.txt" in names
    assert not [n for n in names if n.endswith("~") or n.endswith(".swp") or "__pycache__" in n]
    for needed in (  # what hosts need besides code: catalogs, rates, systemd units, type marker
        "calque/py.typed",
        "calque/data/gpu-catalog.yaml",
        "calque/data/ec2-rates.yaml",
        "calque/session/systemd/calque-session.service",
        "calque/session/systemd/calque-broker.service",
        "calque/session/systemd/session.example.yaml",
    ):
        assert needed in names, f"{needed} missing from {first.name}"
    assert not any(n.startswith("modal/") for n in names), "the modal stand-in must never ship as a top-level package"
    assert f"calque-{__version__}.dist-info/METADATA" in names
    meta = zipfile.ZipFile(first).read(f"calque-{__version__}.dist-info/METADATA").decode()
    assert "Requires-Dist: prometheus-client" in meta


@pytest.mark.slow
def test_a_wheel_built_from_the_same_sources_comes_from_the_cache_and_changed_sources_build_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pool.yml builds the wheel on every run: with unchanged sources the build is copied from the cache
    (the bytes follow from the sources), and any change of a packaged file builds a new one."""
    monkeypatch.setenv("CALQUE_CACHE_DIR", str(tmp_path / "cache"))
    src = _source_with_leftovers(tmp_path)
    built = build_wheel(tmp_path / "one", source=src)
    kept = list((tmp_path / "cache" / "wheels").glob(f"*/{wheel_name()}"))
    assert len(kept) == 1 and kept[0].read_bytes() == built.read_bytes()
    assert not list((tmp_path / "cache" / "wheels").glob("*/.partial-*"))
    # A mark in the kept wheel shows where the next build came from: the cache, not pip.
    kept[0].write_bytes(built.read_bytes() + b"cached")
    (src / "runtime" / "calque" / "pool" / "worker.py~").write_text("# another backup: not a package file\n")
    assert build_wheel(tmp_path / "two", source=src).read_bytes().endswith(b"cached")
    # A changed package file is another digest: built again, and kept beside the first.
    errors = src / "runtime" / "calque" / "errors.py"
    errors.write_text(errors.read_text() + "\n# changed\n")
    again = build_wheel(tmp_path / "three", source=src)
    assert not again.read_bytes().endswith(b"cached")
    assert "# changed" in zipfile.ZipFile(again).read("calque/errors.py").decode()
    assert len(list((tmp_path / "cache" / "wheels").glob(f"*/{wheel_name()}"))) == 2


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One wheelhouse for this module's tests (pip's cache is warm; the index is reached if not)."""
    out = tmp_path_factory.mktemp("wheelhouse")
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:  # an empty calque cache: pip downloads, and the wheels are kept
        mp.setenv("CALQUE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        build_wheelhouse(out, hashes=True, progress=lines.append)
    assert any(line.startswith("building") for line in lines) and any("Saved" in line for line in lines)
    yield out


@pytest.mark.slow
def test_a_second_wheelhouse_takes_the_dependency_wheels_from_the_cache_and_never_a_damaged_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALQUE_CACHE_DIR", str(tmp_path / "cache"))
    first: list[str] = []
    build_wheelhouse(tmp_path / "one", progress=first.append)
    assert any("Saved" in line for line in first)
    [kept] = (tmp_path / "cache" / "dependency-wheels").iterdir()
    assert not list(kept.parent.glob(".partial-*"))

    again: list[str] = []
    build_wheelhouse(tmp_path / "two", progress=again.append)
    assert not any("Saved" in line for line in again) and any("from the cache" in line for line in again)
    assert (tmp_path / "one" / "SHA256SUMS").read_text() == (tmp_path / "two" / "SHA256SUMS").read_text()

    # a kept wheel that changed since it was kept is not used: pip downloads again and the copy is replaced
    damaged = next(p for p in kept.glob("*.whl"))
    damaged.write_bytes(damaged.read_bytes() + b"damaged")
    third: list[str] = []
    build_wheelhouse(tmp_path / "three", progress=third.append)
    assert any("Saved" in line for line in third)
    assert (tmp_path / "three" / "SHA256SUMS").read_text() == (tmp_path / "one" / "SHA256SUMS").read_text()
    assert not damaged.read_bytes().endswith(b"damaged")

    # another target is another key: nothing of this platform's wheels is offered for it
    assert not build_wheelhouse_cached_for(tmp_path, "3.12")


def build_wheelhouse_cached_for(tmp_path: Path, python_version: str) -> bool:
    """Whether the cache holds wheels for ``python_version`` (this controller's platform)."""
    from calque.packaging.wheelhouse import _dependency_cache, default_platform

    pins = runtime_pins()
    return (
        _dependency_cache(pins, python_version, default_platform(), tmp_path / "one" / wheel_name()) / "wheels.json"
    ).exists()


@pytest.mark.slow
def test_wheelhouse_holds_one_calque_wheel_its_pins_and_sums(wheelhouse: Path) -> None:
    wheels = sorted(p.name for p in wheelhouse.glob("*.whl"))
    assert [w for w in wheels if w.startswith("calque-")] == [wheel_name()]
    assert {p.name for p in wheelhouse.iterdir()} == {*wheels, "requirements.txt", "SHA256SUMS"}
    reqs = {}
    for line in (wheelhouse / "requirements.txt").read_text().splitlines():
        m = re.fullmatch(r"([a-z0-9-]+)==(\S+) --hash=sha256:([0-9a-f]{64})", line)
        assert m, line
        reqs[m[1]] = m[2]
    pins = {re.sub(r"[-_.]+", "-", n).lower(): v for n, v in runtime_pins().items()}
    assert reqs == {**pins, "calque": __version__}
    assert len(wheels) == len(reqs)
    for line in (wheelhouse / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        assert hashlib.sha256((wheelhouse / name).read_bytes()).hexdigest() == digest


@pytest.mark.slow
def test_wheelhouse_installs_calque_and_exactly_its_pins_with_no_index(wheelhouse: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "--no-index", "--find-links", str(wheelhouse), "-r", str(wheelhouse / "requirements.txt")],
        check=True,
        timeout=300,
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1] for line in out.split()}
    assert installed["calque"] == __version__
    for name, version in runtime_pins().items():
        assert installed[re.sub(r"[-_.]+", "-", name).lower()] == version, name
    version = subprocess.run([str(venv / "bin" / "calque"), "--version"], capture_output=True, text=True, check=True)
    assert __version__ in version.stdout


def test_wheelhouse_refuses_a_directory_that_already_holds_wheels(tmp_path: Path) -> None:
    from calque.errors import UsageError

    (tmp_path / "old-1.0-py3-none-any.whl").write_bytes(b"")
    with pytest.raises(UsageError, match="empty directory"):
        build_wheelhouse(tmp_path)


@pytest.mark.slow
def test_staged_wheelhouse_is_uploaded_once_and_the_user_data_installs_exactly_its_pins(
    moto: str, wheelhouse: Path, tmp_path: Path
) -> None:
    from calque.aws.clients import client
    from calque.models import PoolSpec
    from calque.pool.bootstrap import worker_user_data
    from calque.pool.submitter.runtime_wheel import stage_runtime

    client("s3").create_bucket(Bucket="lab-runs")
    wheel = wheelhouse / wheel_name()
    first = stage_runtime("lab-runs", "calque", ttl_s=3600, wheel=wheel, wheelhouse=wheelhouse)
    again = stage_runtime("lab-runs", "calque", ttl_s=3600, wheel=wheel, wheelhouse=wheelhouse)
    assert first.uploaded and not again.uploaded  # the same wheel and wheelhouse: nothing re-uploaded
    assert first.wheelhouse_sha256 == again.wheelhouse_sha256 and again.wheelhouse_url
    assert first.wheelhouse_key and first.wheelhouse_key.startswith("calque/runtime/calque-")

    spec = PoolSpec.model_validate({"model": "lab/embedder", "workload": "/opt/w.py", "bucket": "lab-runs"})
    script = tmp_path / "user-data.sh"
    script.write_text(
        worker_user_data(
            spec,
            runtime_url=again.url,
            runtime_sha256=again.sha256,
            wheelhouse_url=again.wheelhouse_url,
            wheelhouse_sha256=again.wheelhouse_sha256,
        )
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {"PATH": "/usr/bin:/bin", "CALQUE_BOOTSTRAP_STEP": "install_runtime", "CALQUE_BOOTSTRAP_VENV": str(venv)}
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=300)  # the script itself passes --no-index
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"prometheus_client=={runtime_pins()['prometheus_client']}" in out.replace("-", "_")
    assert f"calque=={__version__}" in out


@pytest.mark.slow
def test_a_staged_wheelhouse_built_around_this_wheel_stands_and_any_other_is_built_again(
    moto: str, wheelhouse: Path
) -> None:
    """The second run of the default path downloads nothing: the staged wheelhouse says which wheel it
    was built around. One built around another wheel, or staged by a calque that did not say, is
    built again (and restaged with the wheel's sha256); check mode predicts each case as the real run."""
    from calque.aws.clients import client
    from calque.pool.submitter.runtime_wheel import SHA_METADATA, WHEEL_SHA_METADATA, predict_runtime, stage_runtime

    s3 = client("s3")
    s3.create_bucket(Bucket="lab-runs")
    wheel = wheelhouse / wheel_name()

    def built(said: list[str]) -> bool:  # a wheelhouse was built (its dependencies downloaded or from the cache)
        return any(line.startswith("wheelhouse ") and " wheels, " in line for line in said)

    def stage() -> tuple[Any, list[str]]:
        said: list[str] = []
        return stage_runtime("lab-runs", "calque", ttl_s=3600, wheel=wheel, wheelhouse=True, progress=said.append), said

    def predicted() -> Any:
        return predict_runtime("lab-runs", "calque", ttl_s=3600, wheel=wheel, wheelhouse=True)

    first, said = stage()
    assert first.uploaded and built(said)
    key = first.wheelhouse_key
    meta = s3.head_object(Bucket="lab-runs", Key=key)["Metadata"]
    assert meta == {SHA_METADATA: first.wheelhouse_sha256, WHEEL_SHA_METADATA: first.sha256}

    guess = predicted()
    assert guess.wheelhouse_known and not guess.staged.uploaded
    assert guess.staged.wheelhouse_sha256 == first.wheelhouse_sha256
    again, said = stage()
    assert not again.uploaded and again.wheelhouse_sha256 == first.wheelhouse_sha256
    assert not built(said) and any("stands" in line for line in said)

    for stale in ({SHA_METADATA: first.wheelhouse_sha256, WHEEL_SHA_METADATA: "0" * 64},  # another wheel's
                  {SHA_METADATA: first.wheelhouse_sha256}):  # fmt: skip  # staged by an older calque
        s3.copy_object(
            Bucket="lab-runs", Key=key, CopySource={"Bucket": "lab-runs", "Key": key},
            Metadata=stale, MetadataDirective="REPLACE",
        )  # fmt: skip
        guess = predicted()
        assert not guess.wheelhouse_known and guess.staged.uploaded
        rebuilt, said = stage()
        assert rebuilt.uploaded and built(said)
        assert rebuilt.wheelhouse_sha256 == first.wheelhouse_sha256  # the same pins and wheel: the same tar
        assert s3.head_object(Bucket="lab-runs", Key=key)["Metadata"][WHEEL_SHA_METADATA] == first.sha256


def test_a_notebooks_wheelhouse_keeps_the_runtimes_top_level_and_indexes_the_extra_in_its_own_folder(
    tmp_path: Path,
) -> None:
    """The indexing step over one stand-in file per pinned wheel (its content is what the sums cover)."""
    from calque.packaging.wheelhouse import _index

    extra = notebooks_pins()
    assert {"jupyterhub", "jupyterlab", "configurable-http-proxy"} <= {n.lower() for n in extra}
    assert not set(extra) & set(runtime_pins())  # the extra's folder holds only what the runtime lacks
    for name, version in {**runtime_pins(), **extra, "calque": __version__}.items():
        (tmp_path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_text(f"{name} {version}")
    _index(tmp_path, wheel_name(), {**runtime_pins(), **extra}, False, lambda _msg: None, notebooks=extra)

    def listed(folder: Path) -> dict[str, str]:
        return dict(line.split("==") for line in (folder / "requirements.txt").read_text().split())

    def norm(pins: dict[str, str]) -> dict[str, str]:
        return {re.sub(r"[-_.]+", "-", n).lower(): v for n, v in pins.items()}

    assert listed(tmp_path) == {**norm(runtime_pins()), "calque": __version__}
    assert listed(tmp_path / "notebooks") == norm(extra)
    assert len(list((tmp_path / "notebooks").glob("*.whl"))) == len(extra)
    for folder in (tmp_path, tmp_path / "notebooks"):  # every file of a folder, and notebooks/'s index, summed
        sums = dict(reversed(line.split("  ")) for line in (folder / "SHA256SUMS").read_text().splitlines())
        assert set(sums) == {p.name for p in folder.glob("*.whl")} | {"requirements.txt"} | (
            {"notebooks/SHA256SUMS"} if folder == tmp_path else set()
        )
        for name, digest in sums.items():
            assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
