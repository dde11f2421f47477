"""The rules of an elastic session-host class that need no AWS: names, what a class serves, the demand
policy's steps, the hosts' IAM documents, the munge key's one place."""

from __future__ import annotations

from pathlib import Path

import pytest
from calque.aws.acquire.fleet_scaling import FleetScalingSettings
from calque.aws.fleet_iam import broker_policy, host_policy
from calque.errors import UsageError
from calque.models.fleet import MungeKeySource, fleet_pool, registration_path, serves
from pydantic import ValidationError

ACCOUNT, REGION = "123456789012", "eu-west-2"


def test_a_class_is_named_as_a_pool_and_registers_under_its_own_path() -> None:
    assert fleet_pool("teaching-rtx6000") == "fleet/teaching-rtx6000"
    assert registration_path("teaching-rtx6000") == "/calque/session-fleet/teaching-rtx6000/hosts"
    for bad in ("Teaching", "a/b", "-x", "x" * 41, ""):
        with pytest.raises(ValueError):
            fleet_pool(bad)


def test_what_a_class_can_serve() -> None:
    assert serves(["1g.24gb"], "mig", "1g.24gb") and serves(["1g.24gb"], "mig", None)
    assert not serves(["1g.24gb"], "mig", "2g.48gb") and not serves(["1g.24gb"], "mps", None)
    assert serves(["mps"], "mps", None) and not serves(["mps"], "mig", None)


def test_the_demand_steps_add_a_host_per_slices_per_host_unserved_requests() -> None:
    s = FleetScalingSettings(slices_per_host=4, max_step=3, idle_s=1230)
    assert s.steps() == [
        {"MetricIntervalLowerBound": 0.0, "MetricIntervalUpperBound": 4.0, "ScalingAdjustment": 1},
        {"MetricIntervalLowerBound": 4.0, "MetricIntervalUpperBound": 8.0, "ScalingAdjustment": 2},
        {"MetricIntervalLowerBound": 8.0, "ScalingAdjustment": 3},
    ]
    # the alarm's threshold is 1: a value v is v - 1 above it, so 1..4 unserved -> 1 host, 5..8 -> 2, 9+ -> 3
    assert [s.hosts_for(u) for u in (0, 1, 4, 5, 8, 9, 200)] == [0, 1, 1, 2, 2, 3, 3]
    assert s.idle_periods == 21  # whole minutes, rounded up


def test_the_hosts_read_only_their_munge_key() -> None:
    ssm = host_policy(
        "t", MungeKeySource(ssm_parameter="/i/munge", kms_key_arn="arn:aws:kms:eu-west-2:123456789012:key/k"),
        region=REGION, account=ACCOUNT, bucket="b-runtime",
    )  # fmt: skip
    by = {s["Sid"]: s for s in ssm["Statement"]}
    assert by["MungeKeyOnly"] == {
        "Sid": "MungeKeyOnly", "Effect": "Allow", "Action": ["ssm:GetParameter"],
        "Resource": "arn:aws:ssm:eu-west-2:123456789012:parameter/i/munge",
    }  # fmt: skip
    assert by["MungeKeyDecrypt"]["Condition"] == {"StringEquals": {"kms:ViaService": "ssm.eu-west-2.amazonaws.com"}}
    assert by["OwnRegistration"]["Resource"].endswith(":parameter/calque/session-fleet/t/hosts/*")
    assert by["ClassGroupOnly"]["Condition"] == {"StringEquals": {"autoscaling:ResourceTag/calque:pool": "fleet/t"}}
    s3 = host_policy(
        "t", MungeKeySource(s3_bucket="sec", s3_key="munge.key"), region=REGION, account=ACCOUNT, bucket="b-runtime"
    )
    assert {s["Sid"]: s for s in s3["Statement"]}["MungeKeyOnly"]["Resource"] == "arn:aws:s3:::sec/munge.key"
    assert "MungeKeyDecrypt" not in {s["Sid"] for s in s3["Statement"]}
    every = [a for s in ssm["Statement"] + s3["Statement"] for a in s["Action"]]
    assert not any(a.endswith("*") for a in every)


def test_the_broker_publishes_only_into_its_namespace() -> None:
    doc = broker_policy(["t"], region=REGION, account=ACCOUNT)
    by = {s["Sid"]: s for s in doc["Statement"]}
    assert by["DemandMetricOnly"]["Condition"] == {"StringEquals": {"cloudwatch:namespace": "calque/session"}}
    assert by["FindClassHosts"]["Resource"] == [
        "arn:aws:ssm:eu-west-2:123456789012:parameter/calque/session-fleet/t/hosts"
    ]


@pytest.mark.parametrize(
    "doc",
    [{}, {"ssm_parameter": "/a", "s3_bucket": "b", "s3_key": "k"}, {"s3_bucket": "b"}, {"ssm_parameter": "no-slash"}],
)
def test_the_munge_key_is_in_exactly_one_place(doc: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        MungeKeySource.model_validate(doc)


def test_broker_yaml_takes_a_fleet_section_and_refuses_a_bad_one(tmp_path: Path) -> None:
    from calque.session.broker.broker_config import load_broker_config

    good = tmp_path / "broker.yaml"
    good.write_text(
        "fleet:\n  region: eu-west-2\n  wait_s: 2m\n  classes:\n    teaching-rtx6000: {offers: [1g.24gb]}\n"
    )
    fleet = load_broker_config(good).fleet
    assert fleet is not None and fleet.wait_s == 120 and fleet.classes["teaching-rtx6000"].offers == ["1g.24gb"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("fleet:\n  region: eu-west-2\n  classes:\n    Teaching: {offers: []}\n")
    with pytest.raises(UsageError) as err:
        load_broker_config(bad)
    assert "Teaching" in str(err.value) and "offers" in str(err.value)
