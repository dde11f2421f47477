"""The session host's user-data, step by step in bash, against moto and a stand-in IMDS on 127.0.0.1.

``calque.session.fleet.userdata`` renders the script the class's launch template carries; each step
runs alone here (``CALQUE_FLEET_STEP``) under a scratch root (``CALQUE_FLEET_ROOT``) with this
checkout's calque (``CALQUE_FLEET_CALQUE``): the class's files, the munge key from moto's SSM
SecureString (0400, the exact bytes) and from an S3 object with SSE (one without SSE refused), the
host's session.yaml named for the instance, its registration, and the fleet helper's first look.
The runtime's install step is the pool workers' own (``calque.packaging.shell``), run by
tests/pool/test_warm_bootstrap.py.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import yaml
from calque.aws.clients import client
from calque.models.fleet import SessionHostSpec, registration_path
from calque.session.fleet.userdata import session_host_user_data

from .conftest import REPO, Host
from .test_fleet import CLASS
from .test_fleet import instance as instance  # the fixture, shared

KEY = os.urandom(64)


def spec(moto: str, imds_url: str, **munge: Any) -> SessionHostSpec:
    return SessionHostSpec(
        fleet_class=CLASS, region="us-east-1", endpoint_url=moto, imds_endpoint=imds_url,
        session_config={"default_ttl": "2h", "gpu_backend": "sim"},
        institution={"broker": {"address": "10.0.0.10", "service_user": "root"}, "labs": []},
        mig_configs={"small": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}]},
        mig_config="small", offers=["1g.5gb"], port=7461,
        munge_key=munge or {"ssm_parameter": "/calque/munge-key"},
    )  # fmt: skip


def step(script: Path, name: str, root: Path, imds_url: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if k.startswith(("AWS_", "CALQUE_OFFLINE"))},
        "PATH": "/usr/bin:/bin",
        "CALQUE_FLEET_STEP": name,
        "CALQUE_FLEET_ROOT": str(root),
        "CALQUE_FLEET_CALQUE": str(REPO / ".venv/bin/calque"),
        "CALQUE_IMDS": imds_url,
        **extra,
    }
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)


def test_the_user_data_steps_make_a_session_host(host: Host, instance: Any, moto: str, tmp_path: Path) -> None:
    iid, imds = instance
    client("ssm").put_parameter(Name="/calque/munge-key", Type="SecureString", Value=base64.b64encode(KEY).decode())
    script = tmp_path / "user-data.sh"
    script.write_text(session_host_user_data(spec(moto, imds.url), runtime_pip="calque"))
    root = tmp_path / "root"

    done = step(script, "write_files", root, imds.url)
    assert done.returncode == 0, done.stderr
    layout = yaml.safe_load((root / "etc/calque/mig-layout.yaml").read_text())
    assert layout["mig-configs"]["small"][0]["mig-devices"] == {"1g.5gb": 7}
    assert yaml.safe_load((root / "etc/calque/institution.yaml").read_text())["broker"]["address"] == "10.0.0.10"

    done = step(script, "munge_key", root, imds.url)
    assert done.returncode == 0, done.stderr
    key_file = root / "etc/munge/munge.key"
    assert key_file.read_bytes() == KEY and stat.S_IMODE(key_file.stat().st_mode) == 0o400
    assert base64.b64encode(KEY).decode() not in done.stdout + done.stderr  # never printed

    done = step(script, "host_config", root, imds.url)
    assert done.returncode == 0, done.stderr
    cfg = yaml.safe_load((root / "etc/calque/session.yaml").read_text())
    assert cfg["host_name"] == iid and cfg["listen_tcp"] == {"address": "127.0.0.1", "port": 7461}
    assert cfg["default_ttl"] == "2h"

    done = step(script, "register", root, imds.url)
    assert done.returncode == 0, done.stderr
    reg = json.loads(client("ssm").get_parameter(Name=f"{registration_path(CLASS)}/{iid}")["Parameter"]["Value"])
    assert (reg["name"], reg["fleet_class"], reg["offers"]) == (iid, CLASS, ["1g.5gb"])

    host.start(mps=False)
    done = step(script, "protect_once", root, imds.url, CALQUE_FLEET_PROTECT_ARGS=f"--socket {host.socket}")
    assert done.returncode == 0, done.stderr
    assert "not protected" in done.stdout


def test_the_munge_key_from_s3_needs_server_side_encryption(instance: Any, moto: str, tmp_path: Path) -> None:
    _, imds = instance
    s3 = client("s3")
    s3.create_bucket(Bucket="institution-secrets")
    s3.put_object(Bucket="institution-secrets", Key="munge.key", Body=KEY, ServerSideEncryption="AES256")
    s3.put_object(Bucket="institution-secrets", Key="plain.key", Body=KEY)
    for key, ok in (("munge.key", True), ("plain.key", False)):
        script = tmp_path / f"{key}.sh"
        script.write_text(
            session_host_user_data(spec(moto, imds.url, s3_bucket="institution-secrets", s3_key=key), runtime_pip="x")
        )
        root = tmp_path / key
        done = step(script, "munge_key", root, imds.url)
        assert (done.returncode == 0) is ok, done.stderr
        if ok:
            assert (root / "etc/munge/munge.key").read_bytes() == KEY
        else:
            assert "without server-side encryption" in done.stderr
            assert not (root / "etc/munge/munge.key").exists()
