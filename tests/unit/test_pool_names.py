"""Pool names: every derived AWS name is valid, distinct per pool, and stable."""

from __future__ import annotations

import re

import pytest
from calque.aws.naming import pool_key_base
from calque.models.pool_names import POOL_TAG, ForeignPoolError, owned_by, pool_names, refuse_foreign
from hypothesis import given
from hypothesis import strategies as st

SEGMENT = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,18}[a-z0-9])?", fullmatch=True)
POOLS = st.lists(SEGMENT, min_size=1, max_size=3).map("/".join).filter(lambda p: len(p) <= 64)


@given(POOLS)
def test_every_derived_name_fits_its_aws_limit(pool: str) -> None:
    names = pool_names(pool)
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,80}", names.queue)
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,80}", names.dlq)
    assert re.fullmatch(r"[A-Za-z0-9()./_-]{3,128}", names.template)
    assert re.fullmatch(r"[\w+=,.@-]{1,64}", names.role)
    assert re.fullmatch(r"[\w+=,.@-]{1,128}", names.instance_profile)
    assert len(names.group) <= 255


@given(POOLS, POOLS)
def test_two_pools_never_share_a_resource_name(a: str, b: str) -> None:
    if a != b:
        assert pool_names(a).queue != pool_names(b).queue
        assert pool_names(a).role != pool_names(b).role


@given(POOLS, POOLS)
def test_no_pools_keys_lie_under_another_pools_key_base(a: str, b: str) -> None:
    # The key base is what the workers' IAM policy grants: the hashed queue name, never the pool name,
    # so a grant on lab-a's keys never reaches lab-a/embedder's.
    if a != b:
        base_a = pool_key_base("calque", pool_names(a).queue) + "/"
        assert not (pool_key_base("calque", pool_names(b).queue) + "/").startswith(base_a)


def test_two_labs_serving_one_model_get_two_queues() -> None:
    assert pool_names("lab-a/embedder").queue != pool_names("lab-b/embedder").queue


def test_long_names_are_truncated_but_stay_distinct() -> None:
    a, b = "x" * 30 + "/" + "y" * 30 + "a", "x" * 30 + "/" + "y" * 30 + "b"
    assert pool_names(a).queue != pool_names(b).queue
    assert len(pool_names(a).role) <= 64


@pytest.mark.parametrize(
    "bad", ["", "Lab/x", "lab//x", "/lab", "lab/", "-lab", "a/b/c/d", "lab a", "x" * 65, "lab/../x"]
)
def test_invalid_pool_names_are_refused_with_the_rule(bad: str) -> None:
    with pytest.raises(ValueError, match=r"pool name .* is not valid: use"):
        pool_names(bad)


def test_tags_decide_ownership_and_foreign_resources_are_refused() -> None:
    mine = pool_names("lab-a/embedder")
    assert mine.tags == {POOL_TAG: "lab-a/embedder"}
    assert owned_by(mine.tags, "lab-a/embedder") is True
    assert owned_by([{"Key": POOL_TAG, "Value": "lab-b/embedder"}], "lab-a/embedder") is False
    assert owned_by({"other": "x"}, "lab-a/embedder") is None
    refuse_foreign("queue", "q", None, "lab-a/embedder")
    with pytest.raises(ForeignPoolError, match=r"tagged calque:pool='lab-b/embedder', not 'lab-a/embedder'"):
        refuse_foreign("queue", "q", {POOL_TAG: "lab-b/embedder"}, "lab-a/embedder")
