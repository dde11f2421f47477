"""The workers' role, enforced: a moto server of its own with IAM authorization on.

moto enforces IAM policies once its count of unauthenticated actions (``INITIAL_NO_AUTH_ACTION_COUNT``)
is used up. This server starts with a budget for the setup (bucket, two labs' queues, the worker role
with calque's rendered trust and inline policy, an admin user for the submitter), and the setup ends
by setting the budget to 0 through moto's own ``/moto-api/reset-auth``: from then on every request is
signed, its credentials looked up and its action checked against the caller's policies. The worker
runs with the role's credentials from STS AssumeRole (what an instance gets from its profile).

Where moto is less precise than AWS: it authorizes ``sqs:GetQueueUrl`` against ``*`` (it cannot see
the queue in a JSON-protocol request), where AWS uses the queue's ARN, which the rendered policy
grants. The role gets one more inline policy, ``moto-only-get-queue-url``, for that call alone. And
moto checks a batch call against its own action name (``sqs:DeleteMessageBatch``), where AWS checks
it against the single action's (``sqs:DeleteMessage`` grants ``DeleteMessageBatch``, the SQS
Developer Guide's "Amazon SQS batch actions"): ``moto-only-batch-actions`` grants the batch name on
exactly the resources the rendered policy grants ``sqs:DeleteMessage`` on. Every other call
(receive, delete, visibility, attributes, send, every S3 call) is checked against calque's rendered
policy as it is.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from calque.aws.clients import client
from calque.aws.iam_policy import PoolIamDocuments, pool_iam_documents
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.errors import UsageError
from calque.models import Item, QueueSettings
from calque.models.pool_names import pool_names
from calque.pool.bootstrap import stage_workload, start_worker_process
from calque.pool.submitter import submit as core
from calque.pool.worker.loadguard import WorkerLoadError

from pool.conftest import PROC_WAIT, RUN_WAIT, STEADY, wait_until

pytestmark = pytest.mark.slow

BUCKET = "calque-iam-test"
MODEL = "org/steady"  # both labs serve the same model: the pools differ by name alone
POOL_A, POOL_B = "lab-a/embedder", "lab-b/embedder"
REGION = "us-east-1"
SETUP_BUDGET = "100000"  # unauthenticated actions allowed before the setup closes the window
MOTO_GET_QUEUE_URL = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "sqs:GetQueueUrl", "Resource": "*"}],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Creds:
    key: str
    secret: str
    token: str | None = None

    def env(self) -> dict[str, str]:
        out = {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret}
        if self.token:
            out["AWS_SESSION_TOKEN"] = self.token
        return out

    def client(self, service: str, url: str) -> Any:
        return boto3.client(
            service,
            region_name=REGION,
            endpoint_url=url,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
            aws_session_token=self.token,
        )


@dataclass
class IamWorld:
    url: str
    account: str
    docs: PoolIamDocuments
    worker: Creds  # pool A's role, assumed
    admin: Creds  # an IAM user allowed everything: the submitter and the test's reader
    workload_b: str  # the workload script staged under pool B's keys


@pytest.fixture
def iam_moto() -> Iterator[str]:
    """A moto server process of its own (IAM enforcement is process-wide), with a setup budget."""
    port = _free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": SETUP_BUDGET}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=2).read()
            return True
        except OSError:
            return proc.poll() is not None and pytest.fail(f"moto server exited ({proc.returncode})")

    try:
        wait_until(up, PROC_WAIT, "the IAM moto server")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _enforce(url: str) -> None:
    req = urllib.request.Request(
        f"{url}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
    )
    urllib.request.urlopen(req, timeout=10).read()


@pytest.fixture
def world(iam_moto: str, tmp_path: Path) -> IamWorld:
    url = iam_moto
    setup = Creds("testing", "testing")
    sts, iam, s3 = setup.client("sts", url), setup.client("iam", url), setup.client("s3", url)
    account = sts.get_caller_identity()["Account"]
    s3.create_bucket(Bucket=BUCKET)
    settings = QueueSettings(visibility_timeout=30, receive_wait=1, max_receive_count=10, encryption=False)
    for pool in (POOL_A, POOL_B):
        PoolQueue(setup.client("sqs", url), MODEL, pool_names(pool).queue).ensure(settings)
    docs = pool_iam_documents(POOL_A, bucket=BUCKET, region=REGION, account=account)
    tags = [{"Key": k, "Value": v} for k, v in docs.tags.items()]
    iam.create_role(RoleName=docs.role_name, AssumeRolePolicyDocument=json.dumps(docs.trust_policy), Tags=tags)
    iam.put_role_policy(
        RoleName=docs.role_name, PolicyName=docs.policy_name, PolicyDocument=json.dumps(docs.worker_policy)
    )
    iam.put_role_policy(
        RoleName=docs.role_name, PolicyName="moto-only-get-queue-url", PolicyDocument=json.dumps(MOTO_GET_QUEUE_URL)
    )
    deletes = [st["Resource"] for st in docs.worker_policy["Statement"] if "sqs:DeleteMessage" in st["Action"]]
    assert deletes, "the rendered policy must let workers delete their messages"
    allow = [{"Effect": "Allow", "Action": "sqs:DeleteMessageBatch", "Resource": r} for r in deletes]
    batch = {"Version": "2012-10-17", "Statement": allow}
    iam.put_role_policy(RoleName=docs.role_name, PolicyName="moto-only-batch-actions", PolicyDocument=json.dumps(batch))
    iam.create_instance_profile(InstanceProfileName=docs.instance_profile_name, Tags=tags)
    iam.add_role_to_instance_profile(InstanceProfileName=docs.instance_profile_name, RoleName=docs.role_name)
    assumed = sts.assume_role(RoleArn=docs.role_arn, RoleSessionName="i-0123456789abcdef0")["Credentials"]
    worker = Creds(assumed["AccessKeyId"], assumed["SecretAccessKey"], assumed["SessionToken"])
    iam.create_user(UserName="lab-admin")
    everything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="lab-admin", PolicyName="admin", PolicyDocument=json.dumps(everything))
    key = iam.create_access_key(UserName="lab-admin")["AccessKey"]
    admin = Creds(key["AccessKeyId"], key["SecretAccessKey"])
    workload_b = stage_workload(s3, BUCKET, "calque", pool_names(POOL_B).queue, str(STEADY))
    _enforce(url)
    return IamWorld(url, account, docs, worker, admin, workload_b)


def _spec(world: IamWorld, tmp: Path, pool: str, **changes: Any) -> Path:
    doc: dict[str, Any] = {
        "model": MODEL,
        "workload": str(STEADY),
        "bucket": BUCKET,
        "prefix": "calque",
        "region": REGION,
        "endpoint_url": world.url,
        "queue_name": pool_names(pool).queue,
        "queue": {"visibility_timeout": 30, "receive_wait": 1, "max_receive_count": 10},
        "spot_watch": False,
        "shutdown_grace_s": 10,
        **changes,
    }
    path = tmp / f"spec-{pool.replace('/', '-')}-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _start(world: IamWorld, spec: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(world.worker.env(), AWS_ENDPOINT_URL=world.url, AWS_DEFAULT_REGION=REGION, PYTHONUNBUFFERED="1")
    err = tmp / f"{spec.stem}.err"
    return start_worker_process(spec, env=env, stdout=subprocess.DEVNULL, stderr=err.open("wb")), err


def test_worker_role_serves_its_pool_and_is_refused_on_another(
    world: IamWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)  # an IAM user's keys carry no token
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", world.admin.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", world.admin.secret)
    a, b = pool_names(POOL_A), pool_names(POOL_B)

    # pool A's worker, with pool A's role, serves pool A: every claim processed, every result written
    target = core.PoolTarget(MODEL, BUCKET, "calque", REGION, world.url, queue_name=a.queue)
    items = [Item(index=i, args=[i]) for i in range(6)]
    record = core.submit(target, items, method="work", batch_size=2)
    proc, err = _start(world, _spec(world, tmp_path, POOL_A), tmp_path)
    store = target.store(a.queue)
    try:
        wait_until(lambda: store.summary_count(record.results_prefix) >= 3, RUN_WAIT, "pool A's three Summaries")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=PROC_WAIT)
    assert proc.returncode == 0, err.read_text()
    assert "AccessDenied" not in err.read_text() and "may not do this" not in err.read_text(), err.read_text()
    assert all(s.ok for s in store.summaries(record.results_prefix).values())
    assert [(r.index, r.value["x"]) for r in store.results(record)] == [(i, i) for i in range(6)]
    depth = target.queue().depth()  # every claim deleted once done: nothing left visible or in flight
    assert (depth.visible, depth.in_flight) == (0, 0), depth

    # the same role on pool B's queue: refused, and the worker says so and exits with the usage code
    proc, err = _start(world, _spec(world, tmp_path, POOL_B), tmp_path)
    proc.wait(timeout=PROC_WAIT)
    text = err.read_text()
    assert proc.returncode == UsageError.exit_code, text
    assert b.queue in text and "may not do this" in text, text

    # ... and on pool B's keys: a workload staged under them cannot be read, so nothing is served; the
    # worker records that load failure under its own pool's keys (which it may write) and exits 3
    proc, err = _start(world, _spec(world, tmp_path, POOL_A, workload=world.workload_b), tmp_path)
    proc.wait(timeout=PROC_WAIT)
    text = err.read_text()
    assert proc.returncode == WorkerLoadError.exit_code, text
    assert f"cannot download workload {world.workload_b}" in text and "AccessDenied" in text, text
    assert f"recorded in s3://{BUCKET}/calque/pools/{a.queue}/load/" in text, text

    # through calque's own store and queue: writes and reads under B's keys and B's queue are refused
    role_s3, role_sqs = world.worker.client("s3", world.url), world.worker.client("sqs", world.url)
    foreign = RunStore(role_s3, BUCKET, "calque", b.queue)
    with pytest.raises(UsageError, match="may not do this") as refused:
        foreign.put(foreign.run_prefix("run-x") + "run.json", b"{}")
    assert "AccessDenied" in str(refused.value) and b.queue in str(refused.value)
    with pytest.raises(UsageError, match="may not do this"):
        foreign.get_run(record.run_id)
    with pytest.raises(UsageError, match="may not do this"):
        PoolQueue(role_sqs, MODEL, b.queue).receive(0, 1)
    assert (
        client("s3", endpoint_url=world.url)
        .list_objects_v2(Bucket=BUCKET, Prefix=f"calque/pools/{b.queue}/runs/")
        .get("KeyCount", 0)
        == 0
    )
