"""The bootstrap's warm path: the user-data's own steps, by bash, against moto and a stand-in IMDS on 127.0.0.1.

moto makes no warm instances and has no CompleteLifecycleAction: tests/support/fake_lifecycle_action.py
adds the call (strict: an action must be open for the instance and the hook) and ``open_action`` stands
for AWS putting an instance in ``Warmed:Pending:Wait``. The instance id is a real instance of the
pool's group in moto; the IMDS (tests/pool/conftest.py's FakeImds) answers its id, its target
lifecycle state and its role's credentials. The runtime is the controller's wheel, staged in moto's
S3 and installed by the user-data's install step with ``--no-deps --no-index`` into a scratch venv;
its dependencies come from this test's own virtualenv through a ``.pth`` file (there is no index here).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from calque.aws.acquire.warm_pool import LAUNCH_HOOK
from calque.aws.clients import client
from calque.models import PoolSpec
from calque.models.pool_names import pool_names
from calque.pool.bootstrap import spec_yaml, stage_workload, worker_user_data
from calque.pool.submitter.runtime_wheel import stage_runtime
from calque.warm.loader import load_workload
from support import fake_lifecycle_action as fla

from .conftest import FakeImds

POOL = "lab-a/embedder"
GROUP = pool_names(POOL).group
WORKLOAD = """
import os, pathlib
import modal

app = modal.App("warm")


@app.cls(gpu="L4", min_containers=1, scaledown_window=600)
class Embedder:
    @modal.build()
    def download(self):
        if os.environ.get("FAIL_BUILD"):
            raise RuntimeError("the weights server said 503")
        root = pathlib.Path(os.environ["HF_HOME"])
        root.mkdir(parents=True, exist_ok=True)
        (root / "weights.bin").write_bytes(b"w" * 4096)
        with open(os.environ["BUILD_LOG"], "a") as fh:
            fh.write("built\\n")

    @modal.enter(snap=True)
    def load_to_cpu(self):
        self.weights = (pathlib.Path(os.environ["HF_HOME"]) / "weights.bin").read_bytes()

    @modal.method()
    def size(self, x: int) -> int:
        return len(self.weights) + x
"""


def _group_instance() -> str:
    """A real instance of the pool's group in moto: it stands for the one AWS launched into the warm pool."""
    ec2, asg = client("ec2"), client("autoscaling")
    ami = client("ssm").get_parameter(Name="/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64")
    tid = ec2.create_launch_template(
        LaunchTemplateName="warm-test", LaunchTemplateData={"ImageId": ami["Parameter"]["Value"]}
    )["LaunchTemplate"]["LaunchTemplateId"]
    asg.create_auto_scaling_group(
        AutoScalingGroupName=GROUP, MinSize=1, MaxSize=2, DesiredCapacity=1, AvailabilityZones=["us-east-1a"],
        LaunchTemplate={"LaunchTemplateId": tid, "Version": "1"},
    )  # fmt: skip
    asg.put_lifecycle_hook(
        AutoScalingGroupName=GROUP, LifecycleHookName=LAUNCH_HOOK, HeartbeatTimeout=1800, DefaultResult="ABANDON",
        LifecycleTransition="autoscaling:EC2_INSTANCE_LAUNCHING",
    )  # fmt: skip
    asg.put_warm_pool(AutoScalingGroupName=GROUP, MinSize=1, PoolState="Stopped")
    groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"]
    return str(groups[0]["Instances"][0]["InstanceId"])


@pytest.fixture
def instance(moto: str, tmp_path: Path, fake_imds: FakeImds) -> dict[str, Any]:
    """The pool's bucket, staged workload and runtime; the IMDS of one warmed instance; the bash env."""
    s3 = client("s3")
    s3.create_bucket(Bucket="lab-a-runs")
    script = tmp_path / "embedder.py"
    script.write_text(WORKLOAD)
    uri = stage_workload(s3, "lab-a-runs", "calque", "calque-pool-lab-a", f"{script}::Embedder")
    iid = _group_instance()
    fake_imds.paths.update(
        {
            "instance-id": iid,
            "autoscaling/target-lifecycle-state": "Warmed:Stopped",
            "iam/security-credentials/": "calque-pool-lab-a-worker",
            "iam/security-credentials/calque-pool-lab-a-worker": json.dumps(
                {"AccessKeyId": "testing", "SecretAccessKey": "testing", "Token": "testing"}
            ),
        }
    )
    spec = PoolSpec(
        model="org/embedder", pool=POOL, workload=uri, bucket="lab-a-runs", endpoint_url=moto,
        imds_endpoint=fake_imds.url, spot_watch=False,
    )  # fmt: skip
    spec_path = tmp_path / "pool.yml"
    spec_path.write_text(spec_yaml(spec))
    state = tmp_path / "var-lib-calque"
    state.mkdir()
    (state / "expires-epoch").write_text("1\n")  # the TTL boothook's first-boot deadline
    env = {
        **{k: v for k, v in os.environ.items() if k.startswith(("AWS_", "CALQUE_OFFLINE"))},
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "CALQUE_BOOTSTRAP_STEP": "warm",
        "CALQUE_BOOTSTRAP_SPEC": str(spec_path),
        "CALQUE_BOOTSTRAP_PIP_ARGS": "--no-deps --no-index",
        "CALQUE_IMDS": fake_imds.url,
        "CALQUE_READY_MARK": str(state / "ready.json"),
        "CALQUE_WEIGHTS_CACHE": str(state / "cache"),
        "CALQUE_WORKLOAD_CACHE": str(state / "workloads"),
        "CALQUE_TTL_MARK": str(state / "expires-epoch"),
        "BUILD_LOG": str(tmp_path / "build.log"),
        "CALQUE_PCI_DEVICES": str(tmp_path / "pci"),  # this machine's bus says nothing about the instance's
    }
    return {"spec": spec, "spec_path": spec_path, "iid": iid, "env": env, "state": state, "imds": fake_imds}


def _venv(path: Path, *, with_pip: bool = True) -> Path:
    args = [sys.executable, "-m", "venv", str(path)] + ([] if with_pip else ["--without-pip"])
    subprocess.run(args, check=True, timeout=120)
    purelib = next(path.glob("lib/python*/site-packages"))
    (purelib / "calque-test-deps.pth").write_text(site.getsitepackages()[0] + "\n")  # boto3 and friends
    return path


def _bash(user_data: str, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "user-data.sh"
    script.write_text(user_data)
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_warmed_instance_continues_only_once_ready_and_a_later_start_repeats_nothing(
    instance: dict[str, Any], tmp_path: Path
) -> None:
    staged = stage_runtime("lab-a-runs", "calque", ttl_s=3600)
    venv = _venv(tmp_path / "venv")
    env = {**instance["env"], "CALQUE_BOOTSTRAP_VENV": str(venv)}
    user_data = worker_user_data(instance["spec"], runtime_url=staged.url, runtime_sha256=staged.sha256)
    fla.open_action(GROUP, LAUNCH_HOOK, instance["iid"])  # AWS: Warmed:Pending:Wait
    res = _bash(user_data, tmp_path, env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [(c.instance_id, c.result) for c in fla.COMPLETED] == [(instance["iid"], "CONTINUE")]
    state: Path = instance["state"]
    mark = json.loads((state / "ready.json").read_text())
    assert mark["steps"] == ["Embedder.download", "Embedder.load_to_cpu"]  # @build, then @enter(snap=True)
    assert (state / "cache" / "huggingface" / "weights.bin").stat().st_size == 4096  # the cache the worker reuses
    assert (tmp_path / "build.log").read_text() == "built\n"
    assert not (state / "expires-epoch").exists()  # the TTL starts at the start in service, not this boot

    # a later start out of the warm pool: the worker unit's ExecStartPre, then its @enter without @build
    instance["imds"].paths["autoscaling/target-lifecycle-state"] = "InService"
    fla.open_action(GROUP, LAUNCH_HOOK, instance["iid"])  # AWS: Pending:Wait on the way into service
    cmd = [str(venv / "bin" / "calque"), "pool", "warm-up", "--spec", str(instance["spec_path"]), "--wait-in-service"]
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("already ready") and "CONTINUE" in again.stdout
    assert [c.result for c in fla.COMPLETED] == ["CONTINUE", "CONTINUE"]
    assert (tmp_path / "build.log").read_text() == "built\n"  # nothing repeated
    os.environ["CALQUE_READY_MARK"] = env["CALQUE_READY_MARK"]
    try:
        from calque.pool.worker.instance_ready import skip_built

        local = next((state / "workloads").rglob("embedder.py"))
        worker_view = skip_built(load_workload(f"{local}::Embedder"))
        assert worker_view.build == [] and len(worker_view.enter_snap) == 1  # the worker skips @build
    finally:
        del os.environ["CALQUE_READY_MARK"]

    # a weight step that fails abandons the launch: AWS terminates the instance instead of warming it
    (state / "ready.json").unlink()
    instance["imds"].paths["autoscaling/target-lifecycle-state"] = "Warmed:Stopped"
    fla.open_action(GROUP, LAUNCH_HOOK, instance["iid"])
    res = _bash(user_data, tmp_path, {**env, "FAIL_BUILD": "1"})
    assert res.returncode != 0 and "the weights server said 503" in res.stderr
    assert [c.result for c in fla.COMPLETED] == ["CONTINUE", "CONTINUE", "ABANDON"]
    assert not (state / "ready.json").exists()


def test_a_failed_runtime_install_abandons_the_launch_before_calque_exists(
    instance: dict[str, Any], tmp_path: Path, moto: str
) -> None:
    s3 = client("s3")
    s3.put_object(Bucket="lab-a-runs", Key="calque/runtime/wheelhouse.tar", Body=b"not the wheelhouse")
    url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": "lab-a-runs", "Key": "calque/runtime/wheelhouse.tar"}, ExpiresIn=600
    )
    venv = _venv(tmp_path / "venv", with_pip=False)
    env = {**instance["env"], "CALQUE_BOOTSTRAP_VENV": str(venv)}
    user_data = worker_user_data(
        instance["spec"], runtime_url=url, runtime_sha256="0" * 64, wheelhouse_url=url, wheelhouse_sha256="1" * 64
    )
    fla.open_action(GROUP, LAUNCH_HOOK, instance["iid"])
    res = _bash(user_data, tmp_path, env)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "did NOT match" in out  # the wheelhouse's sha256 check failed
    assert "lifecycle action ABANDON completed for " + instance["iid"] in out  # by the stdlib signer
    assert [(c.group, c.hook, c.result) for c in fla.COMPLETED] == [(GROUP, LAUNCH_HOOK, "ABANDON")]
    assert not (venv / "bin" / "calque").exists() and not (instance["state"] / "ready.json").exists()


NVIDIA_SMI_OK = "#!/bin/sh\necho 'GPU 0: NVIDIA L40S (UUID: GPU-5c3e8ad2-0000-4000-8000-000000000000)'\n"
NVIDIA_SMI_NO_DRIVER = (  # what nvidia-smi says on an image whose kernel module is missing or mismatched
    "#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
    "the latest NVIDIA driver is installed and running.'\nexit 9\n"
)
STUB_CALQUE = '#!/bin/sh\necho "calque stand-in: $*"\n'  # the runtime, as installed: the warm-up's command line


def _driver_check(
    instance: dict[str, Any], tmp_path: Path, *, itype: str | None, smi: str | None, pci_gpu: bool = False
) -> subprocess.CompletedProcess[str]:
    """The user-data's warm step on an instance of type ``itype`` (None: IMDS does not say) whose image has
    ``smi`` as nvidia-smi (None: none), with an NVIDIA 3D controller on its PCI bus when ``pci_gpu``; the
    runtime already installed (a stand-in ``calque``), so the step ends at the warm-up's command."""
    if shutil.which("nvidia-smi", path="/usr/bin:/bin") is not None:
        pytest.skip("this machine has an nvidia-smi of its own on the PATH the user-data runs with")
    if itype is not None:
        instance["imds"].paths["instance-type"] = itype
    bin_dir, venv = tmp_path / "image-bin", tmp_path / "venv"
    bin_dir.mkdir()
    (venv / "bin").mkdir(parents=True)
    for path, text in ((bin_dir / "nvidia-smi", smi), (venv / "bin" / "calque", STUB_CALQUE)):
        if text is not None:
            path.write_text(text)
            path.chmod(0o755)
    device = tmp_path / "pci" / "0000:00:1e.0"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x10de\n" if pci_gpu else "0x1d0f\n")  # NVIDIA, else Amazon's ENA
    (device / "class").write_text("0x030200\n" if pci_gpu else "0x020000\n")
    env = {**instance["env"], "CALQUE_BOOTSTRAP_VENV": str(venv), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    fla.open_action(GROUP, LAUNCH_HOOK, instance["iid"])  # AWS: Warmed:Pending:Wait
    return _bash(worker_user_data(instance["spec"], runtime_pip="calque"), tmp_path, env)


@pytest.mark.parametrize(
    ("itype", "smi", "pci_gpu", "why"),
    [
        ("g6e.xlarge", None, False, "g6e.xlarge has NVIDIA GPUs but the image has no nvidia-smi (no NVIDIA driver)"),
        ("p5.48xlarge", NVIDIA_SMI_NO_DRIVER, False, "p5.48xlarge has NVIDIA GPUs but nvidia-smi -L fails"),
        ("g9x.2xlarge", None, True, "g9x.2xlarge has NVIDIA GPUs but the image has no nvidia-smi"),  # not in the table
    ],
)
def test_a_gpu_instance_without_a_working_nvidia_smi_abandons_the_launch(
    instance: dict[str, Any], tmp_path: Path, itype: str, smi: str | None, pci_gpu: bool, why: str
) -> None:
    res = _driver_check(instance, tmp_path, itype=itype, smi=smi, pci_gpu=pci_gpu)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and why in res.stderr, out  # the reason, in the bootstrap's log
    assert "lifecycle action ABANDON completed for " + instance["iid"] in out
    assert [(c.group, c.hook, c.instance_id, c.result) for c in fla.COMPLETED] == [
        (GROUP, LAUNCH_HOOK, instance["iid"], "ABANDON")
    ]
    assert "calque stand-in" not in out  # never warmed


@pytest.mark.parametrize(
    ("itype", "smi", "said"),
    [
        ("g6e.xlarge", NVIDIA_SMI_OK, "GPU 0: NVIDIA L40S"),
        ("c7i.large", None, "c7i.large, no NVIDIA GPU: driver check skipped"),
        (None, None, "an unknown instance type, no NVIDIA GPU: driver check skipped"),
    ],
)
def test_an_instance_whose_driver_answers_or_that_has_no_gpu_goes_on_to_warm_up(
    instance: dict[str, Any], tmp_path: Path, itype: str | None, smi: str | None, said: str
) -> None:
    res = _driver_check(instance, tmp_path, itype=itype, smi=smi)
    assert res.returncode == 0, res.stdout + res.stderr
    assert said in res.stdout and f"calque stand-in: pool warm-up --spec {instance['spec_path']}" in res.stdout
    assert fla.COMPLETED == []  # the warm-up completes the hook itself
