"""Capacity sweep benchmark: the Acquirer against a naive one-at-a-time launcher, side by side.

Scenario: a cohort of 8 instances over 3 AZs; the first-choice type (g6.xlarge) is out of capacity in
2 of the 3 AZs; the second choice (g6e.xlarge) is available everywhere. Both strategies run against
the same local moto server with the same injected latency per API call (default 50 ms), the
same capacity faults (injected at the botocore layer, see tests/acquire/capacity.py) and the same
hardened launch request; both resolve the AMI first and wait until every instance runs.

- acquirer: ``calque.aws.acquire.Acquirer.apply`` (parallel sweep over subnets, remembers which
  (type, AZ) pairs are out, quota preflight, plan read and final read).
- naive: for each instance in turn, try (type, AZ) in preference order, retrying the same pair up to
  3 times with exponential backoff (0.1 s, 0.2 s) before moving on; it remembers nothing between
  instances.

Prints API calls and wall seconds per strategy (medians over --repeat runs) and the ratios.
Run: .venv/bin/python bench/acquire_sweep.py [--repeat 5] [--latency-ms 50]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # for tests.acquire.capacity (the fault and latency hooks)

os.environ.update(
    {
        "CALQUE_OFFLINE": "1",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
)
for _k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
    os.environ.pop(_k, None)

from botocore.exceptions import ClientError  # noqa: E402
from calque.aws.acquire import Acquirer, CohortSpec, Consent  # noqa: E402
from calque.aws.acquire.launch_spec import (  # noqa: E402
    build_user_data,
    cohort_tags,
    expires_at,
    resolve_image,
    run_instances_params,
)
from calque.aws.aws_errors import kind  # noqa: E402
from calque.aws.clients import client  # noqa: E402

from tests.acquire.capacity import CallCounter, CapacityFaults  # noqa: E402

AZS = ("us-east-1a", "us-east-1b", "us-east-1c")
AL2023 = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
TYPES = ["g6.xlarge", "g6e.xlarge"]
COUNT = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fresh_world(endpoint: str) -> list[str]:
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=10).read()
    ec2 = client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    return [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.9.{i}.0/24", AvailabilityZone=az)["Subnet"]["SubnetId"]
        for i, az in enumerate(AZS)
    ]


def instrumented(latency_s: float) -> tuple[dict[str, Any], list[CallCounter]]:
    clients = {name: client(name) for name in ("ec2", "ssm", "service-quotas")}
    counters = [CallCounter(c, latency_s) for c in clients.values()]
    faults = CapacityFaults(clients["ec2"])
    for az in AZS[:2]:
        faults.out_of_capacity(TYPES[0], az)
    return clients, counters


def spec(subnets: list[str]) -> CohortSpec:
    return CohortSpec(
        name="bench",
        count=COUNT,
        instance_types=TYPES,
        subnets=subnets,
        ami_ssm_parameter=AL2023,
        ttl_seconds=3600,
        wait_timeout_s=120,
    )


def run_acquirer(subnets: list[str], latency_s: float) -> tuple[float, int, int, int]:
    clients, counters = instrumented(latency_s)
    acq = Acquirer(ec2=clients["ec2"], ssm=clients["ssm"], service_quotas=clients["service-quotas"], waiter_delay_s=1)
    t0 = time.perf_counter()
    result = acq.apply(spec(subnets), Consent(spend=True))
    wall = time.perf_counter() - t0
    return wall, sum(c.total for c in counters), counters[0].calls["RunInstances"], len(result.instances)


def run_naive(
    subnets: list[str], latency_s: float, tries: int = 3, backoff_s: float = 0.1
) -> tuple[float, int, int, int]:
    clients, counters = instrumented(latency_s)
    ec2, ssm = clients["ec2"], clients["ssm"]
    s = spec(subnets)
    t0 = time.perf_counter()
    image_id, root = resolve_image(ec2, ssm, s)
    expires = expires_at(s.ttl_seconds)
    tags, user_data = cohort_tags(s, expires), build_user_data(expires)
    ids: list[str] = []
    for _ in range(COUNT):
        placed = False
        for itype in TYPES:
            for subnet in subnets:
                for attempt in range(tries):
                    params = run_instances_params(
                        s,
                        image_id=image_id,
                        root_device=root,
                        instance_type=itype,
                        subnet_id=subnet,
                        market="on-demand",
                        count=1,
                        tags=tags,
                        user_data=user_data,
                    )
                    try:
                        ids += [i["InstanceId"] for i in ec2.run_instances(**params)["Instances"]]
                        placed = True
                        break
                    except ClientError as exc:
                        if kind(exc) != "capacity":
                            raise
                        if attempt + 1 < tries:
                            time.sleep(backoff_s * 2**attempt)
                if placed:
                    break
            if placed:
                break
    ec2.get_waiter("instance_running").wait(InstanceIds=ids, WaiterConfig={"Delay": 1, "MaxAttempts": 120})
    wall = time.perf_counter() - t0
    return wall, sum(c.total for c in counters), counters[0].calls["RunInstances"], len(ids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    args = ap.parse_args()
    latency = args.latency_ms / 1000

    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    rows: dict[str, list[tuple[float, int, int, int]]] = {"acquirer": [], "naive": []}
    try:
        for _ in range(args.repeat):
            for name, fn in (("acquirer", run_acquirer), ("naive", run_naive)):
                rows[name].append(fn(fresh_world(endpoint), latency))
    finally:
        server.stop()

    def med(name: str, i: int) -> float:
        return statistics.median(r[i] for r in rows[name])

    print(
        f"cohort of {COUNT} over {len(AZS)} AZs; {TYPES[0]} out of capacity in {AZS[0]}, {AZS[1]}; "
        f"{args.latency_ms:.0f} ms injected per API call; medians of {args.repeat} runs"
    )
    print(f"{'strategy':<10} {'wall s':>8} {'API calls':>10} {'RunInstances':>13} {'launched':>9}")
    for name in rows:
        print(f"{name:<10} {med(name, 0):>8.2f} {med(name, 1):>10.0f} {med(name, 2):>13.0f} {med(name, 3):>9.0f}")
    print(
        f"ratio naive/acquirer: wall {med('naive', 0) / med('acquirer', 0):.1f}x, "
        f"API calls {med('naive', 1) / med('acquirer', 1):.1f}x, "
        f"RunInstances {med('naive', 2) / med('acquirer', 2):.1f}x"
    )


if __name__ == "__main__":
    main()
