"""``calque.gpu.pool_scaling`` through real ansible-playbook runs against the moto server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from acquire.scaling_fixtures import make_group
from calque.aws.acquire.scaling import policy_names
from calque.aws.clients import client
from calque.models.pool_names import pool_names
from support.ansible import run_playbook

pytestmark = pytest.mark.slow

POOL = "lab-a/embedder"


def _task(**options: Any) -> dict[str, Any]:
    return {
        "name": "scaling",
        "calque.gpu.pool_scaling": {"pool": POOL, "seconds_per_claim": 12.5, "latency_s": 300, **options},
    }


def _target() -> float:
    backlog = policy_names(pool_names(POOL))[0]
    found = client("autoscaling").describe_policies(PolicyNames=[backlog])["ScalingPolicies"]
    return float(found[0]["TargetTrackingConfiguration"]["TargetValue"])


def test_scaling_is_set_once_then_unchanged_and_check_mode_shows_a_new_target(moto: str, tmp_path: Path) -> None:
    group = make_group(POOL)
    first = run_playbook(tmp_path, [_task()])
    assert first.rc == 0, first.stdout + first.stderr
    r = first.task("scaling")
    assert r["changed"] is True and r["group_name"] == group and r["target_backlog_per_instance"] == 24
    assert r["lifecycle_hooks"] == ["calque-drain"] and len(r["alarms"]) == 2 and len(r["policies"]) == 3

    second = run_playbook(tmp_path, [_task()])
    assert second.rc == 0 and second.task("scaling")["changed"] is False

    plan = run_playbook(tmp_path, [_task(latency_s=600)], check=True, diff=True)
    p = plan.task("scaling")
    backlog = policy_names(pool_names(POOL))[0]
    assert p["changed"] is True and p["target_backlog_per_instance"] == 48
    before = p["diff"]["before"]["policies"][backlog]["TargetTrackingConfiguration"]["TargetValue"]
    after = p["diff"]["after"]["policies"][backlog]["TargetTrackingConfiguration"]["TargetValue"]
    assert (before, after) == (24.0, 48.0)
    assert _target() == 24.0  # check mode wrote nothing


def test_bad_input_fails_saying_what_to_change(moto: str, tmp_path: Path) -> None:
    make_group(POOL)
    run = run_playbook(tmp_path, [_task(idle_s=30)])
    assert run.rc != 0
    r = run.task("scaling")
    assert r["failed"] is True and "idle_s" in r["msg"]
    assert client("cloudwatch").describe_alarms()["MetricAlarms"] == []
