"""The worker bootstrap: the spec file's text, the user-data that starts a worker, s3:// workloads."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
import yaml
from calque.aws.clients import client
from calque.cli.main import run
from calque.models import PoolSpec
from calque.pool.bootstrap import (
    SPEC_PATH_ON_INSTANCE,
    materialize_workload,
    spec_yaml,
    stage_workload,
    worker_user_data,
)
from calque.pool.spec import load_spec
from calque.warm import load_workload
from support.waits import HANG_S

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "embedder.py"


def _spec(**kw: object) -> PoolSpec:
    base: dict[str, object] = {
        "model": "lab/embedder",
        "workload": "s3://lab-runs/k/embedder.py::Embedder",
        "bucket": "lab-runs",
    }
    base.update(kw)
    return PoolSpec.model_validate(base)


def test_user_data_writes_the_same_spec_and_starts_the_worker_under_systemd() -> None:
    spec = _spec(workers=2, cuda_visible_devices=["0", "1"], method="embed")
    text = worker_user_data(spec, runtime_pip="calque @ https://example.invalid/calque-0.1.0-py3-none-any.whl")
    assert text.startswith("#!/bin/bash\n")
    encoded = re.search(r"<<'CALQUE_SPEC'\n(.*?)\nCALQUE_SPEC", text, re.S)
    assert encoded is not None
    written = base64.b64decode(encoded.group(1).replace("\n", "")).decode()
    assert written == spec_yaml(spec)
    assert PoolSpec.model_validate(yaml.safe_load(written)) == spec  # the instance reads the same spec
    assert f"ExecStart=/opt/calque/venv/bin/python -m calque.pool.worker --spec {SPEC_PATH_ON_INSTANCE}" in text
    assert "systemctl enable calque-pool-worker.service" in text  # started after warm_steps reached ready
    assert "systemctl start --no-block calque-pool-worker.service" in text
    assert text.index("warm_steps /opt/calque/venv") < text.index("systemctl start --no-block")
    assert "pip install --quiet 'calque @ https://example.invalid/calque-0.1.0-py3-none-any.whl'" in text
    assert not re.search(r"@[A-Z_0-9]+@", text)  # every placeholder filled


def test_user_data_command_validates_the_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "pool.yml"
    spec.write_text(spec_yaml(_spec()))
    assert run(["pool", "user-data", "--spec", str(spec)]) == 0
    assert "calque==0.1.0" in capsys.readouterr().out
    spec.write_text("model: m\nworkload: s3://lab-runs/x.py\nbucket: lab-runs\nworkers: 0\n")
    assert run(["pool", "user-data", "--spec", str(spec)]) == 2
    assert "workers" in capsys.readouterr().err


def test_an_s3_workload_is_staged_then_fetched_and_keeps_its_digest(
    moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = client("s3")
    s3.create_bucket(Bucket="lab-runs")
    uri = stage_workload(s3, "lab-runs", "calque", "calque-pool-lab-x", f"{EXAMPLE}::Embedder")
    assert uri == "s3://lab-runs/calque/pools/calque-pool-lab-x/workload/embedder.py::Embedder"
    path = tmp_path / "spec.yml"
    path.write_text(spec_yaml(_spec(workload=uri, bucket="lab-runs")))
    spec = load_spec(path)
    assert spec.workload == uri  # an s3:// workload is not made relative to the spec file
    monkeypatch.setenv("CALQUE_WORKLOAD_CACHE", str(tmp_path / "cache"))
    local = materialize_workload(spec)
    script = local.workload.partition("::")[0]
    assert Path(script).read_bytes() == EXAMPLE.read_bytes() and str(tmp_path / "cache") in script
    assert load_workload(local.workload).digest == load_workload(f"{EXAMPLE}::Embedder").digest


def test_the_runtime_wheel_is_staged_once_downloaded_verified_and_installed(moto: str, tmp_path: Path) -> None:
    import subprocess
    import sys
    import urllib.request

    from calque import __version__
    from calque.errors import UsageError
    from calque.pool.submitter.runtime_wheel import MAX_URL_TTL_S, SHA_METADATA, stage_runtime

    s3 = client("s3")
    s3.create_bucket(Bucket="lab-runs")
    first = stage_runtime("lab-runs", "calque", ttl_s=3600)
    assert first.uploaded and first.key == f"calque/runtime/calque-{__version__}-py3-none-any.whl"
    head = s3.head_object(Bucket="lab-runs", Key=first.key)
    assert head["Metadata"][SHA_METADATA] == first.sha256
    second = stage_runtime("lab-runs", "calque", ttl_s=3600)  # the same wheel: nothing uploaded
    assert not second.uploaded and second.sha256 == first.sha256
    assert s3.head_object(Bucket="lab-runs", Key=first.key)["LastModified"] == head["LastModified"]
    with pytest.raises(UsageError, match="7 days"):
        stage_runtime("lab-runs", "calque", ttl_s=MAX_URL_TTL_S + 1)

    assert second.url.startswith(moto)  # the presigned URL really serves the wheel
    body = urllib.request.urlopen(second.url, timeout=10).read()
    import hashlib

    assert hashlib.sha256(body).hexdigest() == first.sha256

    # the user-data's own install step, by bash, into a scratch venv (no systemd, no index: --no-deps)
    script = tmp_path / "user-data.sh"
    script.write_text(worker_user_data(_spec(), runtime_url=second.url, runtime_sha256=second.sha256))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=HANG_S)
    env = {
        "PATH": "/usr/bin:/bin",
        "CALQUE_BOOTSTRAP_STEP": "install_runtime",
        "CALQUE_BOOTSTRAP_VENV": str(venv),
        "CALQUE_BOOTSTRAP_PIP_ARGS": "--no-deps --no-index",
    }
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=120)
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('calque'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == __version__
    assert (venv / "bin" / "calque").exists()

    # a wrong sha256 stops the install
    bad = worker_user_data(_spec(), runtime_url=second.url, runtime_sha256="0" * 64)
    script.write_text(bad)
    other = tmp_path / "venv2"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True, timeout=HANG_S)
    res = subprocess.run(
        ["bash", str(script)],
        env={**env, "CALQUE_BOOTSTRAP_VENV": str(other)},
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert res.returncode != 0 and "did NOT match" in res.stdout + res.stderr
    assert not list(other.glob("lib/python*/site-packages/calque"))
