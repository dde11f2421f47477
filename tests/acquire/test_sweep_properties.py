"""Properties of the capacity sweep over any capacity map, with a launch function that behaves like
EC2 (fills a MinCount=1 call up to what is left, answers InsufficientInstanceCapacity when nothing is)."""

from __future__ import annotations

import threading
from typing import Any

from botocore.exceptions import ClientError
from calque.aws.acquire.sweep import Candidate, candidates, sweep
from hypothesis import given, settings
from hypothesis import strategies as st

TYPES = ["g6.xlarge", "g6e.xlarge", "g5.xlarge"]
SUBNETS = ["s-a", "s-b", "s-c"]


class Ec2Like:
    def __init__(self, capacity: dict[Candidate, int]) -> None:
        self.left = dict(capacity)
        self.lock = threading.Lock()

    def launch(self, cand: Candidate, count: int) -> list[dict[str, Any]]:
        with self.lock:
            n = min(count, self.left[cand])
            if n == 0:
                raise ClientError({"Error": {"Code": "InsufficientInstanceCapacity"}}, "RunInstances")
            self.left[cand] -= n
        return [{"InstanceId": f"i-{cand.instance_type}-{cand.subnet_id}-{k}", "cand": cand} for k in range(n)]


@settings(max_examples=200, deadline=None)
@given(
    need=st.integers(min_value=1, max_value=40),
    caps=st.lists(st.integers(min_value=0, max_value=12), min_size=9, max_size=9),
)
def test_sweep_takes_all_it_can_in_preference_order(need: int, caps: list[int]) -> None:
    cands = candidates(["on-demand"], TYPES, SUBNETS)
    ec2 = Ec2Like(dict(zip(cands, caps, strict=True)))
    out = sweep(ec2.launch, cands, need)

    assert out.fatal is None
    assert out.launched == min(need, sum(caps))  # never more than asked, never gives up with capacity left
    used_types = {i["cand"].instance_type for i in out.instances}
    for t in used_types:  # a less preferred type only once every more preferred pool is empty
        for c in cands:
            if TYPES.index(c.instance_type) < TYPES.index(t):
                assert ec2.left[c] == 0
    assert len(out.attempts) <= (need + len(cands)) * len(SUBNETS)
