"""The client factory: loopback only while offline, standard retries, the endpoint variables."""

from __future__ import annotations

import pytest
from calque.aws.clients import client, is_loopback_url
from calque.errors import RefusedError


@pytest.mark.parametrize(
    "url,ok",
    [
        ("http://127.0.0.1:5000", True),
        ("http://127.9.9.9", True),
        ("http://localhost:1", True),
        ("http://[::1]:5000", True),
        ("https://sqs.us-east-1.amazonaws.com", False),
        ("http://10.0.0.1:5000", False),
        ("http://169.254.169.254", False),
        ("not a url", False),
    ],
)
def test_loopback_detection(url: str, ok: bool) -> None:
    assert is_loopback_url(url) is ok


def test_offline_refuses_a_real_endpoint(moto: str) -> None:
    with pytest.raises(RefusedError, match="non-loopback endpoint"):
        client("sqs", endpoint_url="https://sqs.us-east-1.amazonaws.com")


def test_offline_refuses_the_default_aws_endpoint(moto: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    with pytest.raises(RefusedError, match="would reach real AWS"):
        client("s3")


def test_factory_reaches_the_moto_server_with_standard_retries(moto: str) -> None:
    sqs = client("sqs")
    assert sqs.meta.endpoint_url == moto
    assert sqs.meta.config.retries["mode"] == "standard"
    sqs.create_queue(QueueName="smoke")
    assert any(u.endswith("/smoke") for u in sqs.list_queues()["QueueUrls"])


def test_service_specific_endpoint_variable_wins(moto: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://10.1.2.3:9000")
    with pytest.raises(RefusedError):
        client("s3")
    assert client("sqs").meta.endpoint_url == moto


def test_clients_made_at_once_on_threads_each_work_and_leave_the_collector_on(moto: str) -> None:
    """calque pool status makes its clients on several threads (LazyClient): one each, all usable, and
    the collector paused while a client is made is running again afterwards."""
    import gc
    from concurrent.futures import ThreadPoolExecutor

    from calque.aws.clients import LazyClient

    lazy = [LazyClient(service) for service in ("sqs", "s3", "autoscaling", "cloudwatch", "sqs")]
    shared = LazyClient("sqs")
    with ThreadPoolExecutor(max_workers=8) as pool:
        made = list(pool.map(lambda c: c.get(), lazy))
        same = list(pool.map(lambda _: shared.get(), range(8)))
    assert gc.isenabled()
    assert [c.meta.service_model.service_name for c in made] == ["sqs", "s3", "autoscaling", "cloudwatch", "sqs"]
    assert made[0] is not made[4] and all(c is same[0] for c in same)  # a LazyClient makes its client once
    assert lazy[0].list_queues().get("QueueUrls", []) == []  # methods reach the client it made
    assert lazy[1].list_buckets()["Buckets"] == []
