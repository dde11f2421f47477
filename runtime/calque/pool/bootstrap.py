"""How an instance becomes a pool worker: the PoolSpec file and the user-data that starts the worker.

One definition serves every path that puts a worker on an instance: ``playbooks/pool.yml`` renders
the user-data with ``calque.gpu.pool_spec`` (``calque.ops.pool_spec``, as does ``calque pool
user-data``) and hands it to ``calque.gpu.ec2_cohort``;
``calque ramp`` calls ``worker_user_data`` directly. The user-data (a shell script; calque's TTL
boothook runs before it) installs the runtime in ``/opt/calque/venv``, writes the spec to
``/etc/calque/pool.yaml`` and starts the worker under systemd (``python -m calque.pool.worker``: ``calque
pool worker``'s command alone, not the whole CLI). ``spec_yaml`` is the spec file's text; where no
instance can run it (the offline tier) a local worker process is started on the same text.

A workload may be an ``s3://bucket/key.py[::Class]`` URI, so that one spec runs anywhere: the
worker downloads the script at start (``materialize_workload``) into ``CALQUE_WORKLOAD_CACHE``
(default ``~/.cache/calque/workloads``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import yaml

from calque.aws.acquire.warm_pool import LAUNCH_HOOK
from calque.aws.aws_errors import aws_errors
from calque.aws.clients import client
from calque.aws.store import parse_s3_uri
from calque.confignames import POOL_SPEC_ON_HOST
from calque.errors import UsageError
from calque.models import PoolSpec
from calque.models.pool_names import pool_names
from calque.packaging.shell import RUNTIME_FUNCTIONS, RuntimeSource, runtime_values

if TYPE_CHECKING:  # Python 3.10 has no typing.Unpack
    from typing_extensions import Unpack

SPEC_PATH_ON_INSTANCE = str(POOL_SPEC_ON_HOST)
UNIT_NAME = "calque-pool-worker.service"
CACHE_ENV = "CALQUE_WORKLOAD_CACHE"

# Placeholders are @NAME@ so that the shell's own $ and {} need no escaping.
_USER_DATA = r"""#!/bin/bash
# calque pool worker bootstrap for model @MODEL@ (rendered by calque.pool.bootstrap).
# 1. the pool spec in @SPEC_PATH@  2. up to "ready" (warm_steps): the driver check (a GPU type needs a working
# nvidia-smi), the calque runtime in
# /opt/calque/venv (the staged wheelhouse or wheel, sha256 checked), `calque pool warm-up` (workload, its
# weight steps into /var/lib/calque/cache, the calque-ready lifecycle hook: CONTINUE, or ABANDON on failure)
# 3. @UNIT@ (systemd) running `python -m calque.pool.worker --spec @SPEC_PATH@`, on this and every later boot.
# The instance profile must allow the pool's SQS queue and S3 prefix. Log: /var/log/calque-bootstrap.log
set -euo pipefail
PY=$(command -v python3.11 || command -v python3)
RUNTIME_URL=@RUNTIME_URL@      # the staged calque wheel (presigned GET; empty: RUNTIME_PIP)
RUNTIME_SHA256=@RUNTIME_SHA256@
RUNTIME_WHEEL=@WHEEL_NAME@
WHEELHOUSE_URL=@WHEELHOUSE_URL@  # the staged wheelhouse tar (calque + pinned deps; empty: none)
WHEELHOUSE_SHA256=@WHEELHOUSE_SHA256@
IMDS=${CALQUE_IMDS:-@IMDS@}
GROUP=@GROUP@ REGION=@REGION@ ASG_ENDPOINT=@ASG_ENDPOINT@  # the pool's group (empty: none)
HOOK_OPEN=0  # 1 while a failure must abandon the launch (before calque, which completes it itself)

abandon() {  # ABANDON the calque-ready hook with the standard library: no runtime, no boto3 yet
  local f
  [ -n "$GROUP" ] || return 0
  f=$(mktemp)
  cat >"$f" <<'CALQUE_SIGNAL'
@SIGNAL_PY@
CALQUE_SIGNAL
  "$PY" "$f" "$IMDS" "$REGION" "$ASG_ENDPOINT" "$GROUP" @HOOK@ ABANDON \
    || echo "calque bootstrap: ABANDON failed; the hook's timeout abandons the launch"
  rm -f "$f"
}
on_exit() {
  local rc=$?
  if [ "$rc" != 0 ] && [ "$HOOK_OPEN" = 1 ]; then
    echo "calque bootstrap: a step failed (exit $rc): abandoning the launch"; abandon
  fi
}
trap on_exit EXIT

@RUNTIME_FUNCTIONS@
instance_type() {  # IMDSv2's instance-type, or nothing
  "$PY" -c 'import sys, urllib.request as u
b = sys.argv[1]
h = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
t = u.urlopen(u.Request(b + "/latest/api/token", method="PUT", headers=h), timeout=5).read().decode()
h = {"X-aws-ec2-metadata-token": t}
print(u.urlopen(u.Request(b + "/latest/meta-data/instance-type", headers=h), timeout=5).read().decode())' "$IMDS" \
    2>/dev/null || true
}
nvidia_on_pci() {  # an NVIDIA display or 3D controller on the bus: a GPU type calque's table may not know yet
  local d
  for d in "${CALQUE_PCI_DEVICES:-/sys/bus/pci/devices}"/*; do
    if [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ]; then
      case "$(cat "$d/class" 2>/dev/null)" in 0x03*) return 0 ;; esac
    fi
  done
  return 1
}
check_driver() {  # a GPU instance type's driver answers, or the instance is no use warm: fail (ABANDON)
  local itype
  itype=$(instance_type)
  if [[ " @GPU_FAMILIES@ " == *" ${itype%%.*} "* && -n "$itype" ]] || nvidia_on_pci; then
    if ! command -v nvidia-smi >/dev/null; then
      echo "calque bootstrap: ${itype:-this instance} has NVIDIA GPUs but the image has no nvidia-smi" \
        "(no NVIDIA driver): failing the driver check, the launch is abandoned; use an image with the driver" >&2
      return 1
    fi
    if ! nvidia-smi -L; then
      echo "calque bootstrap: ${itype:-this instance} has NVIDIA GPUs but nvidia-smi -L fails (the driver does" \
        "not answer): failing the driver check, the launch is abandoned" >&2
      return 1
    fi
  elif command -v nvidia-smi >/dev/null; then
    nvidia-smi -L
  else
    echo "calque bootstrap: ${itype:-an unknown instance type}, no NVIDIA GPU: driver check skipped"
  fi
}

warm_steps() {  # VENV SPEC [PIP_ARGS...]: up to "ready"
  local venv=$1 spec=$2; shift 2
  HOOK_OPEN=1
  check_driver
  if [ ! -x "$venv/bin/calque" ]; then
    install_runtime "$venv" "$@"
  fi
  HOOK_OPEN=0
  "$venv/bin/calque" pool warm-up --spec "$spec"
}

# CALQUE_BOOTSTRAP_STEP runs one step alone (the tests, against a scratch venv and a stand-in IMDS).
case "${CALQUE_BOOTSTRAP_STEP:-}" in
  install_runtime) install_runtime "$CALQUE_BOOTSTRAP_VENV" ${CALQUE_BOOTSTRAP_PIP_ARGS:-}; exit 0 ;;
  warm) warm_steps "$CALQUE_BOOTSTRAP_VENV" "$CALQUE_BOOTSTRAP_SPEC" ${CALQUE_BOOTSTRAP_PIP_ARGS:-}; exit 0 ;;
esac

exec >>/var/log/calque-bootstrap.log 2>&1
echo "calque bootstrap: $(date -u +%FT%TZ)"
HOOK_OPEN=1
if ! "$PY" -m venv --help >/dev/null 2>&1 || ! "$PY" -c 'import ensurepip' >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
fi
install -d -m 0755 /opt/calque /etc/calque
install -d -m 0750 /var/lib/calque
base64 -d >@SPEC_PATH@ <<'CALQUE_SPEC'
@SPEC_B64@
CALQUE_SPEC
chmod 0640 @SPEC_PATH@
cat >/etc/systemd/system/@UNIT@ <<'CALQUE_UNIT'
[Unit]
Description=calque warm pool worker (@MODEL@)
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
# every boot: wait while warmed, check "ready" (a start from the warm pool repeats nothing), CONTINUE
ExecStartPre=/opt/calque/venv/bin/calque pool warm-up --spec @SPEC_PATH@ --wait-in-service
ExecStart=/opt/calque/venv/bin/python -m calque.pool.worker --spec @SPEC_PATH@
TimeoutStartSec=infinity
Environment=CALQUE_WORKLOAD_CACHE=/var/lib/calque/workloads
Environment=CALQUE_WEIGHTS_CACHE=/var/lib/calque/cache HF_HOME=/var/lib/calque/cache/huggingface
Environment=TORCH_HOME=/var/lib/calque/cache/torch XDG_CACHE_HOME=/var/lib/calque/cache/xdg
Restart=on-failure
RestartSec=10
KillMode=mixed
TimeoutStopSec=120

[Install]
WantedBy=multi-user.target
CALQUE_UNIT
warm_steps /opt/calque/venv @SPEC_PATH@
systemctl daemon-reload
systemctl enable @UNIT@
systemctl start --no-block @UNIT@  # warmed: it waits in ExecStartPre; AWS stops the instance
echo "calque bootstrap: ready; @UNIT@ started"
"""


def _signal_source() -> str:
    """``lifecycle_signal.py`` as the user-data carries it: its code, without the module docstring."""
    text = (Path(__file__).parent / "lifecycle_signal.py").read_text(encoding="utf-8")
    return text[text.index('"""', 3) + 3 :].strip()


def gpu_families() -> list[str]:
    """The EC2 families with NVIDIA GPUs (``data/ec2-rates.yaml``): there, an image with no working
    ``nvidia-smi`` fails the bootstrap's driver check (the launch is abandoned, not warmed)."""
    from calque.aws.pricing import family, gpus, known_types

    return sorted({family(t) for t in known_types() if gpus(t) > 0})


def spec_yaml(spec: PoolSpec) -> str:
    """The spec file's text: the fields that differ from the defaults, as YAML."""
    doc = spec.model_dump(mode="json", exclude_defaults=True)
    return yaml.safe_dump(doc, sort_keys=False)


def worker_user_data(spec: PoolSpec, **runtime: Unpack[RuntimeSource]) -> str:
    """The user-data script that turns an instance into a worker of ``spec``'s pool.

    The runtime comes as ``RuntimeSource`` says (``calque.packaging.shell``): ``runtime_pip``, else the
    staged wheel (``calque.pool.submitter.runtime_wheel.stage_runtime``) or wheelhouse, installed with
    ``--no-index``, else ``calque==<this version>``.

    The workload must exist on the instance: an ``s3://`` URI (``stage_workload``) or a path the AMI has.
    """
    installs = runtime_values(runtime)
    encoded = base64.b64encode(spec_yaml(spec).encode()).decode()
    lines = "\n".join(encoded[i : i + 76] for i in range(0, len(encoded), 76))
    values = {
        "@MODEL@": spec.model.replace("\n", " ").replace("%", "%%"),  # systemd expands %
        "@SPEC_PATH@": SPEC_PATH_ON_INSTANCE,
        "@UNIT@": UNIT_NAME,
        **installs,
        "@SPEC_B64@": lines,
        "@IMDS@": shlex.quote(spec.imds_endpoint),
        "@GROUP@": shlex.quote(pool_names(spec.pool).group if spec.pool else ""),
        "@REGION@": shlex.quote(spec.region),
        "@ASG_ENDPOINT@": shlex.quote(spec.endpoint_url or ""),
        "@HOOK@": LAUNCH_HOOK,
        "@GPU_FAMILIES@": " ".join(gpu_families()),
        "@SIGNAL_PY@": _signal_source(),
    }
    text = _USER_DATA.replace("@RUNTIME_FUNCTIONS@\n", RUNTIME_FUNCTIONS)
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def write_spec(spec: PoolSpec, path: str | Path) -> Path:
    """Write ``spec_yaml(spec)`` to ``path`` (mode 0600: it names the pool's bucket and queue)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(spec_yaml(spec))
    return p


def workload_key(prefix: str, queue_name: str, script: Path) -> str:
    """Where a pool's workload script is staged: ``<prefix>/pools/<queue name>/workload/<script name>``."""
    return "/".join(p for p in (prefix.strip("/"), "pools", queue_name, "workload", script.name) if p)


def stage_workload(s3: Any, bucket: str, prefix: str, queue_name: str, workload: str) -> str:
    """Upload a local ``script.py[::Class]`` beside the pool's runs; returns ``s3://...[::Class]``."""
    script, sep, target = workload.partition("::")
    path = Path(script).expanduser().resolve()
    if not path.is_file():
        raise UsageError(f"workload script {path} does not exist")
    key = workload_key(prefix, queue_name, path)
    with aws_errors(f"stage workload {path} at s3://{bucket}/{key}"):
        s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes(), ServerSideEncryption="AES256")
    return f"s3://{bucket}/{key}{sep}{target}"


def materialize_workload(spec: PoolSpec) -> PoolSpec:
    """A spec whose ``s3://`` workload is downloaded to the local cache; other specs unchanged."""
    if not spec.workload.startswith("s3://"):
        return spec
    uri, sep, target = spec.workload.partition("::")
    try:
        bucket, key = parse_s3_uri(uri)
    except ValueError as exc:
        raise UsageError(f"workload {uri!r}: {exc}") from None
    cache = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "calque" / "workloads")
    dest = cache / hashlib.sha256(uri.encode()).hexdigest()[:16] / Path(key).name
    dest.parent.mkdir(parents=True, exist_ok=True)
    s3 = client("s3", region=spec.region, endpoint_url=spec.endpoint_url)
    with aws_errors(f"download workload {uri}"):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    # several worker processes may fetch at once: write aside, then rename into place
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".fetch-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(body)
    os.replace(tmp, dest)
    return spec.model_copy(update={"workload": f"{dest}{sep}{target}"})


def start_worker_process(
    spec_path: str | Path,
    *,
    index: int | None = None,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
) -> subprocess.Popen[bytes]:
    """``python -m calque.pool.worker --spec FILE [--index N]`` (``calque pool worker``) as a child process:
    the one way to start a worker subprocess (``run_workers``, ``calque ramp``'s local stand-in, the tests)."""
    cmd = [sys.executable, "-m", "calque.pool.worker", "--spec", str(spec_path)]
    if index is not None:
        cmd += ["--index", str(index)]
    cmd += list(extra_args)
    return subprocess.Popen(cmd, env=dict(env) if env is not None else None, stdout=stdout, stderr=stderr)
