"""``calque pool status`` of a whole named pool against a moto server on 127.0.0.1, beside its 0.3 s target.

The pool is what ``playbooks/pool.yml`` makes, on moto: a named pool's queue and dead-letter queue,
its Auto Scaling group (one instance) with its backlog policy, and a bucket holding two workers' load
records. The command is the installed ``calque`` console script, as a researcher runs it, with every
part shown: ``calque pool status --pool bench/status --bucket B`` (queue depth, the oldest message's
age, the group and its target, the workers). Each figure is the median wall time of N fresh
processes, run in rounds that run every command once, so a load that comes and goes weighs on all
alike. Printed beside the target (issue 21: under 0.3 s; also scaled to this machine by ``import boto3``,
0.22 s where the target was set), beside ``python -c 'import botocore'``, ``'import botocore.session'``
(the least any AWS client costs) and ``'import boto3'``, and beside the same reads made by a careful
plain botocore script in a process of its own (no calque, click or pydantic), as ratios.

    .venv/bin/python bench/pool_status.py [--runs 15] [--baseline-checkout ../calque-at-an-older-commit]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_startup import moto_server

BIN = Path(sys.executable).parent
POOL = "bench/status"
BUCKET = "calque-bench-status"
TARGET_S = 0.3
ISSUE_BOTO3_S = 0.22  # `import boto3` on the machine issue 21 measured its 387 ms baseline on
AL2023 = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"

# The peer: the command's reads as a careful plain botocore script makes them, no calque, no click and
# no pydantic: one botocore session, its three clients made one after another with the cyclic
# collector off (made at once, each would parse the endpoint data again), then the same calls with the
# same overlap (queue, load records and group at once). The bench's queue is empty, so, like the
# command, it asks CloudWatch nothing. What a botocore process making these reads cannot go below.
PLAIN_BOTOCORE = """
import gc, sys
from concurrent.futures import ThreadPoolExecutor
import botocore.session

queue, bucket, prefix = sys.argv[1:4]
session = botocore.session.Session()
gc.disable()
sqs, s3, asg = (session.create_client(s, region_name="us-east-1") for s in ("sqs", "s3", "autoscaling"))
gc.enable()

def depth():
    for name in (queue, queue + "-dlq"):
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])

def records():
    for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
        s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()

def group():
    asg.describe_auto_scaling_groups(AutoScalingGroupNames=[queue])
    asg.describe_policies(AutoScalingGroupName=queue)

with ThreadPoolExecutor(3) as pool:
    for read in [pool.submit(f) for f in (depth, records, group)]:
        read.result()
"""


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {
        "CALQUE_OFFLINE": "1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL": url,
    }
    return env


def make_pool() -> None:
    """The pool pool.yml makes (queue, group, backlog policy) and two workers' load records, in this process."""
    from calque.aws.clients import client
    from calque.aws.store import RunStore
    from calque.models import LoadRecord
    from calque.models.pool_loads import slot_uri
    from calque.models.pool_names import pool_names
    from calque.ops.base import AwsSession
    from calque.ops.pool_group import PoolGroupOp
    from calque.ops.pool_group_models import PoolGroupRequest
    from calque.ops.pool_queue import PoolQueueOp, PoolQueueRequest
    from calque.ops.pool_scaling import PoolScalingOp, PoolScalingRequest

    aws = AwsSession()
    PoolQueueOp(aws).run(PoolQueueRequest(model="BAAI/bge", pool=POOL))
    ec2 = client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.43.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.43.0.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    group = {"pool": POOL, "count": 1, "instance_types": ["g6.xlarge"], "subnets": [subnet["SubnetId"]]}
    PoolGroupOp(aws).run(PoolGroupRequest(**group, ami_ssm_parameter=AL2023, i_understand_this_spends_money=True))
    PoolScalingOp(aws).run(PoolScalingRequest(pool=POOL, seconds_per_claim=2.0, latency_s=20.0))
    s3 = client("s3")
    s3.create_bucket(Bucket=BUCKET)
    store = RunStore(s3, BUCKET, "calque", pool_names(POOL).queue)
    now = datetime.now(timezone.utc)
    for i in range(2):
        slot = f"host-{i}/0"
        rec = LoadRecord(
            slot=slot, worker_id=f"host-{i}:1/0", state="serving", workload="w.py::Model", methods=["embed"], at=now,
            seen_at=now,
        )  # fmt: skip
        store.put(slot_uri(store, slot), rec.model_dump_json().encode())


def _once(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"benchmark: {' '.join(cmd)} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument(
        "--baseline-checkout",
        type=Path,
        default=None,
        help="another checkout (e.g. a `git worktree` of an older commit): its calque's pool status is timed "
        "too, in the same rounds, and the ratio printed",
    )
    args = ap.parse_args()
    if args.baseline_checkout is not None:
        compileall.compile_dir(str(args.baseline_checkout.resolve() / "runtime" / "calque"), quiet=1)
    # an installed wheel's modules are compiled; compile the checkout's once so no run times the compiler
    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "runtime" / "calque"), quiet=1)
    with moto_server() as url:
        if url is None:
            raise SystemExit("benchmark: moto_server is not installed (the dev dependencies have it)")
        env = _env(url)
        os.environ.update(env)
        make_pool()
        from calque.models.pool_names import pool_names

        queue = pool_names(POOL).queue
        slots = f"calque/pools/{queue}/load/"
        status = [str(BIN / "calque"), "pool", "status", "--pool", POOL, "--bucket", BUCKET]
        rows = [
            ("python -c pass", [sys.executable, "-c", "pass"]),
            ("python -c 'import botocore'", [sys.executable, "-c", "import botocore"]),
            ("python -c 'import botocore.session'", [sys.executable, "-c", "import botocore.session"]),
            ("python -c 'import boto3'", [sys.executable, "-c", "import boto3"]),
            ("plain botocore: the same reads", [sys.executable, "-c", PLAIN_BOTOCORE, queue, BUCKET, slots]),
            ("calque pool status --pool --bucket (moto)", status),
        ]
        envs = [env] * len(rows)
        if args.baseline_checkout is not None:
            rows.insert(-1, (f"the same, calque of {args.baseline_checkout}", status))
            envs.insert(-1, env | {"PYTHONPATH": str(args.baseline_checkout.resolve() / "runtime")})
        _once(status, env)  # moto's first answers build its backends: not the command's time
        times: list[list[float]] = [[] for _ in rows]
        for _ in range(args.runs):
            for i, (_, cmd) in enumerate(rows):
                times[i].append(_once(cmd, envs[i]))
    load = os.getloadavg()
    ms = [statistics.median(t) * 1000 for t in times]
    print(
        f"calque pool status, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, median of {args.runs} rounds, "
        f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    width = max(len(name) for name, _ in rows)
    print(f"{'command':<{width}}  {'ms':>7}  {'x botocore':>10}  {'x session':>9}")
    for (name, _), m in zip(rows, ms, strict=True):
        print(f"{name:<{width}}  {m:7.1f}  {m / ms[1]:9.2f}x  {m / ms[2]:8.2f}x")
    verdict = "under" if ms[-1] < TARGET_S * 1000 else "OVER"
    if args.baseline_checkout is not None:
        print(f"pool status: {ms[-1]:.0f} ms, {ms[-1] / ms[-2]:.2f}x the baseline checkout's {ms[-2]:.0f} ms")
    print(
        f"pool status: {ms[-1]:.0f} ms against the {TARGET_S * 1000:.0f} ms target "
        f"({ms[-1] / 1000 / TARGET_S:.2f}x, {verdict}); {ms[-1] / ms[4]:.2f}x the plain botocore script"
    )
    # The target was set where `import boto3` took 0.22 s (issue 21): the same target on this machine
    scaled = TARGET_S * ms[3] / 1000 / ISSUE_BOTO3_S
    verdict = "under" if ms[-1] < scaled * 1000 else "OVER"
    print(
        f"scaled to this machine (import boto3 {ms[3]:.0f} ms here, {ISSUE_BOTO3_S * 1000:.0f} ms where the target "
        f"was set): {scaled * 1000:.0f} ms; pool status {ms[-1] / 1000 / scaled:.2f}x it ({verdict}); "
        f"the plain botocore script {ms[4] / 1000 / scaled:.2f}x it"
    )


if __name__ == "__main__":
    main()
