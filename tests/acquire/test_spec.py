"""CohortSpec validation and the launch request, without AWS: bad input says what to change."""

from __future__ import annotations

from datetime import datetime, timezone
from email import message_from_string

import pytest
from calque.aws.acquire.launch_spec import build_user_data, cohort_tags
from calque.aws.acquire.sweep import Candidate, candidates, split
from calque.errors import UsageError
from calque.models.acquire import CohortSpec
from pydantic import ValidationError

BASE = {"name": "lab", "count": 2, "instance_types": ["g6.xlarge"]}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"min_viable": 3}, "min_viable (3) is more than count (2)"),
        ({"instance_types": []}, "list at least one EC2 instance type"),
        ({"instance_types": ["g6.xlarge", "g6.xlarge"]}, "lists a type twice"),
        ({"tags": {"calque:cohort": "x"}}, "reserved calque: prefix"),
        ({"ttl_seconds": "3 hours"}, "not a duration"),
        ({"ttl_seconds": "30s"}, "greater than or equal to 60"),
        ({"market": "reserved"}, "'on-demand', 'spot' or 'spot-then-on-demand'"),
        ({"ami": "ami-1", "ami_ssm_parameter": "/x"}, "not both"),
        ({"spot_max_price": 0.5}, "spot markets only"),
        ({"name": "has space"}, "should match pattern"),
    ],
)
def test_bad_specs_say_what_to_change(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        CohortSpec.model_validate({**BASE, **change})
    assert message in str(err.value)


def test_user_data_is_a_ttl_boothook_then_the_callers_part() -> None:
    expires = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    msg = message_from_string(build_user_data(expires, "#cloud-config\npackages: [htop]\n"))
    parts = [p for p in msg.walk() if not p.is_multipart()]
    assert [p.get_content_type() for p in parts] == ["text/cloud-boothook", "text/cloud-config"]
    assert str(int(expires.timestamp())) in parts[0].get_payload() and "2030-01-02T03:04:05Z" in parts[0].get_payload()


def test_user_data_refuses_a_ready_made_multipart() -> None:
    with pytest.raises(UsageError, match="already MIME multipart"):
        build_user_data(datetime.now(timezone.utc), "Content-Type: multipart/mixed; boundary=x\n\n")


def test_tags_carry_cohort_owner_pool_and_expiry() -> None:
    spec = CohortSpec.model_validate({**BASE, "pool": "llama", "owner": "it-staff", "tags": {"Name": "mine"}})
    tags = cohort_tags(spec, datetime(2030, 1, 1, tzinfo=timezone.utc))
    assert tags["calque:cohort"] == "lab" and tags["calque:pool"] == "llama" and tags["calque:owner"] == "it-staff"
    assert tags["calque:expires-at"] == "2030-01-01T00:00:00Z" and tags["Name"] == "mine"


def test_candidates_are_market_then_type_then_subnet() -> None:
    got = candidates(["spot", "on-demand"], ["a.x", "b.x"], ["s1", "s2"])
    assert got[:3] == [Candidate("spot", "a.x", "s1"), Candidate("spot", "a.x", "s2"), Candidate("spot", "b.x", "s1")]
    assert got[4] == Candidate("on-demand", "a.x", "s1")


def test_split_spreads_evenly() -> None:
    assert split(8, 3) == [3, 3, 2] and split(2, 3) == [1, 1, 0]
