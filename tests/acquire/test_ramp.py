"""``calque ramp`` end to end against the moto server: one instance through the Acquirer, one pool worker.

moto's instances run nothing, so (CALQUE_OFFLINE=1) the instance's worker is a local
``calque pool worker`` process on the spec its user-data carries; every rung is a real pool run.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from calque.aws.acquire import Acquirer, Consent
from calque.aws.clients import client
from calque.cli.main import run
from calque.pool.submitter.ramp import RampOptions, run_ramp
from support.waits import HANG_S

from .conftest import AL2023, Network

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "corpus"
SLOW = HERE / "workloads" / "slow_items.py"


BUCKET = "ramp-runs"


@pytest.fixture(autouse=True)
def bucket(moto: str) -> str:
    client("s3").create_bucket(Bucket=BUCKET)
    return BUCKET


def ramp_queues() -> list[str]:
    """Every SQS queue left behind (a ramp deletes its own)."""
    return list(client("sqs").list_queues().get("QueueUrls", []))


def ramp_cohorts(ec2: Any) -> dict[str, list[str]]:
    """State names of every instance a ramp launched, per instance id."""
    res = ec2.describe_instances(Filters=[{"Name": "tag:calque-ramp", "Values": ["*"]}])
    return {i["InstanceId"]: i["State"]["Name"] for r in res["Reservations"] for i in r["Instances"]}


def base_args(network: Network, workload: Path | str, rungs: str) -> list[str]:
    args = ["ramp", "--workload", str(workload), "--rungs", rungs, "--instance-type", "g6.xlarge", "--bucket", BUCKET]
    args += ["--ami-ssm-parameter", AL2023, "--ttl", "1h", "--wait-timeout", "30"]
    for s in network.subnets:
        args += ["--subnet", s]
    return args


def test_ramp_pays_enter_once_and_terminates_at_the_end(
    ec2: Any, network: Network, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = tmp_path / "prompts.jsonl"
    items.write_text(
        '{"args": ["the quick brown fox jumps"]}\n{"args": ["hello there"], "kwargs": {"max_tokens": 1}}\n'
    )
    args = base_args(network, CORPUS / "llm_loader.py", "1,5,20")
    rc = run([*args, "--items", str(items), "--i-understand-this-spends-money", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    report = json.loads(out.out)

    assert [r["items"] for r in report["rungs"]] == [1, 5, 20]
    assert [r["ok"] for r in report["rungs"]] == [1, 5, 20]
    assert report["enter_count"] == 1
    paid = [r["enter_seconds_paid"] for r in report["rungs"]]
    assert paid[0] >= 0.25 and paid[1:] == [0.0, 0.0]  # llm_loader's @enter sleeps 0.3 s
    assert report["method"] == "generate"
    iid = report["instance"]["instance_id"]
    assert report["terminated"] == [iid]
    assert ramp_cohorts(ec2) == {iid: "terminated"}
    assert ramp_queues() == []  # the temporary queue is gone
    assert "ramp: terminating cohort" in out.err
    assert "local process" in out.err  # offline, a local worker stood in for the instance's
    user_data = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
    text = base64.b64decode(user_data).decode()
    assert (
        "/opt/calque/venv/bin/python -m calque.pool.worker --spec /etc/calque/pool.yaml" in text
    )  # the worker command alone
    # the instance installs this calque's wheel, staged under the ramp's prefix, through a presigned URL
    staged = [o["Key"] for o in client("s3").list_objects_v2(Bucket=BUCKET, Prefix="calque/ramps/")["Contents"]]
    wheel = next(k for k in staged if k.endswith("/runtime/calque-0.1.0-py3-none-any.whl"))
    url = re.search(r"^RUNTIME_URL=(\S+)", text, re.M)
    assert url and wheel in url.group(1) and "X-Amz-Signature" in url.group(1)


def test_ramp_human_view_prints_a_table_per_rung(
    ec2: Any, network: Network, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = run([*base_args(network, SLOW, "2,3"), "--i-understand-this-spends-money"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.count("enter s paid") == 3  # one table per rung, then the summary table
    assert "@enter ran 1 time(s)" in out and "terminated: i-" in out


def test_ramp_without_consent_is_refused_and_launches_nothing(
    ec2: Any, network: Network, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = run(base_args(network, SLOW, "1"))
    assert rc == 4
    assert "--i-understand-this-spends-money" in capsys.readouterr().err
    assert ramp_cohorts(ec2) == {}
    assert ramp_queues() == []  # refused before its temporary queue was made


def test_ramp_is_gated_before_any_aws_call(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:  # a loopback port nothing listens on: any AWS call would fail on it
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    args = ["ramp", "--workload", str(SLOW), "--rungs", "1", "--instance-type", "g6.xlarge", "--bucket", BUCKET]
    assert run([*args, "--endpoint-url", dead]) == 4  # the spend gate, not the queue
    err = capsys.readouterr().err
    assert "spends money" in err and "--i-understand-this-spends-money" in err and "cannot" not in err
    # with the consent, a ceiling below the instance's rate is refused there too, before any call
    assert run([*args, "--endpoint-url", dead, "--i-understand-this-spends-money", "--max-hourly-usd", "0.01"]) == 4
    assert "max_hourly_usd $0.01/h" in capsys.readouterr().err


def test_ramp_with_a_failing_enter_still_terminates(
    ec2: Any, network: Network, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = run([*base_args(network, CORPUS / "failing_enter.py", "1,10"), "--i-understand-this-spends-money"])
    err = capsys.readouterr().err
    assert rc == 2 and "weights not found" in err  # the worker's load error, from its log
    states = ramp_cohorts(ec2)
    assert len(states) == 1 and set(states.values()) == {"terminated"}
    assert ramp_queues() == []


def test_a_failure_mid_rung_terminates_the_instance(ec2: Any, network: Network, tmp_path: Path) -> None:
    marker = tmp_path / "exit.txt"
    os.environ["SLOW_EXIT_MARKER"] = str(marker)
    seen: list[int] = []

    def fail_on_the_fourth(result: Any) -> None:
        seen.append(result.index)
        if len(seen) == 4:
            raise RuntimeError("injected: the display broke mid-rung")

    opts = RampOptions(
        workload=str(SLOW),
        rungs=[2, 10],
        instance_type="g6.xlarge",
        subnets=network.subnets,
        ami_ssm_parameter=AL2023,
        wait_timeout_s=30,
        bucket=BUCKET,
    )
    try:
        with pytest.raises(RuntimeError, match="injected"):
            run_ramp(opts, Acquirer(ec2=ec2, waiter_delay_s=1), Consent(spend=True), on_result=fail_on_the_fourth)
    finally:
        os.environ.pop("SLOW_EXIT_MARKER", None)
    states = ramp_cohorts(ec2)
    assert len(states) == 1 and set(states.values()) == {"terminated"}
    assert marker.read_text() == "exit\n"  # the warm worker was stopped once, @exit ran
    assert ramp_queues() == []


def test_unknown_method_and_bad_rungs_say_what_to_change(
    ec2: Any, network: Network, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run([*base_args(network, SLOW, "1,x"), "--i-understand-this-spends-money"]) == 2
    assert "e.g. 1,100,1000" in capsys.readouterr().err
    several = CORPUS / "several_methods.py"
    assert run([*base_args(network, several, "1"), "--i-understand-this-spends-money"]) == 2
    assert "--method" in capsys.readouterr().err  # the worker refused the claim and said why
    assert set(ramp_cohorts(ec2).values()) <= {"terminated"}
    assert ramp_queues() == []


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_mid_rung_terminates_the_instance(ec2: Any, network: Network, tmp_path: Path, signum: int) -> None:
    items = tmp_path / "slow.jsonl"
    items.write_text('{"args": [1], "kwargs": {"delay": 0.5}}\n')
    args = [*base_args(network, SLOW, "1,60"), "--items", str(items), "--i-understand-this-spends-money"]
    calque = Path(sys.executable).parent / "calque"
    # ctrl-c's default action, even where this session inherited SIGINT ignored (a job started with &
    # from a script), which the ramp would rightly keep ignoring.
    proc = subprocess.Popen(
        [str(calque), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + HANG_S
        assert proc.stderr is not None
        seen = ""
        while "rung 1:" not in seen and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen += line
        assert "rung 1:" in seen, seen
        time.sleep(0.5)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "terminating cohort" in seen + err
    states = ramp_cohorts(ec2)
    assert len(states) == 1 and set(states.values()) == {"terminated"}
    assert ramp_queues() == []
    worker = re.search(r"in local process (\d+)", seen)
    assert worker and not Path(f"/proc/{worker.group(1)}").exists()  # the stand-in worker was stopped too


def test_on_aws_the_ramp_notices_its_instance_ended(ec2: Any, spec_for: Any, acquirer: Acquirer) -> None:
    from calque.errors import InfrastructureError
    from calque.pool.submitter.ramp_workers import InstanceWorker

    got = acquirer.apply(spec_for(name="ramp-ended", count=1), Consent(spend=True))
    worker = InstanceWorker(acquirer, "ramp-ended", got.instances[0].instance_id)
    worker.CHECK_EVERY_S = 0.0
    worker.check()  # running: nothing to say
    acquirer.release("ramp-ended", Consent(terminate=True))
    with pytest.raises(InfrastructureError, match="no longer running"):
        worker.check()
