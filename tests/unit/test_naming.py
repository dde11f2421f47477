"""Queue names: valid SQS names for every model, and distinct models never share one."""

from __future__ import annotations

import re

from calque.aws.naming import MAX_QUEUE_NAME, dlq_name, pool_queue_name
from hypothesis import given, settings
from hypothesis import strategies as st

SQS_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
models = st.text(min_size=1, max_size=400)


@given(models)
def test_every_model_gives_a_valid_sqs_name_and_dlq_name(model: str) -> None:
    name = pool_queue_name(model)
    assert SQS_NAME.match(name), name
    assert SQS_NAME.match(dlq_name(name)), dlq_name(name)
    assert len(dlq_name(name)) <= MAX_QUEUE_NAME
    assert name.startswith("calque-pool-")


@settings(max_examples=500)
@given(models, models)
def test_distinct_models_never_share_a_queue(a: str, b: str) -> None:
    if a != b:
        assert pool_queue_name(a) != pool_queue_name(b)


@given(st.text(alphabet="ab/-_. ", min_size=70, max_size=200), st.text(min_size=1, max_size=5))
def test_long_names_sharing_a_prefix_do_not_collide(prefix: str, tail: str) -> None:
    # The Go original truncated without a hash: these all became one queue.
    assert pool_queue_name(prefix + "x" + tail) != pool_queue_name(prefix + "y" + tail)


def test_name_is_stable_and_readable() -> None:
    assert pool_queue_name("meta-llama/Llama-3.1-8B") == pool_queue_name("meta-llama/Llama-3.1-8B")
    assert pool_queue_name("meta-llama/Llama-3.1-8B").startswith("calque-pool-meta-llama-llama-3-1-8b-")
    # Case and punctuation differ, so the hash keeps them apart although the slug is equal.
    assert pool_queue_name("Model.A") != pool_queue_name("model-a")
    assert pool_queue_name("///").startswith("calque-pool-model-")
