"""An endpoint that fails on its side (HTTP 500, an HTML error page, an answer that is not AWS's format)
becomes a calque error naming the call, after botocore's retries: never a parser's traceback.

A real HTTP server on loopback plays the failing endpoint (a moto server that crashed, a proxy's
error page); the calls go through calque's own client factory and CLI.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from calque.aws import aws_errors as aws
from calque.aws.clients import client, retry_config
from calque.cli.main import run
from calque.errors import InfrastructureError

ERROR_PAGE = b"<!doctype html><title>500 Internal Server Error</title><h1>Internal Server Error</h1>"


class FailingEndpoint(http.server.ThreadingHTTPServer):
    answer: tuple[int, bytes]
    requests = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FailingEndpoint

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.requests += 1
        status, body = self.server.answer
        self.send_response(status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_HEAD = do_PUT = _answer

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[FailingEndpoint]:
    srv = FailingEndpoint(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{srv.server_address[1]}")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(
    ("service", "call", "kwargs", "named"),
    [
        ("ec2", "describe_instances", {}, "DescribeInstances"),  # XML: botocore cannot parse the page
        ("autoscaling", "describe_auto_scaling_groups", {}, "DescribeAutoScalingGroups"),
        ("sqs", "get_queue_url", {"QueueName": "q"}, "GetQueueUrl"),  # JSON: a ClientError coded "500"
        ("s3", "head_object", {"Bucket": "b", "Key": "k"}, "HeadObject"),
    ],
)
def test_a_500_error_page_is_a_server_error_naming_the_call(
    endpoint: FailingEndpoint, service: str, call: str, kwargs: dict[str, str], named: str
) -> None:
    endpoint.answer = (500, ERROR_PAGE)
    c = client(service, config=retry_config(max_attempts=2))
    with pytest.raises(InfrastructureError) as err, aws.aws_errors("read the pool"):
        getattr(c, call)(**kwargs)
    text = str(err.value)
    assert text.startswith(f"cannot read the pool ({named}: ") and "Internal Server Error" in text
    assert "<" not in text  # the page's text, not its markup
    assert "the endpoint failed on its side, even after retries" in text
    # botocore's standard mode retried the 5xx it could read (2 retries: 3 requests); a page it cannot
    # parse is raised at once
    assert endpoint.requests == (3 if service in ("sqs", "s3") else 1)


def test_an_answer_that_is_not_aws_format_is_a_server_error_naming_the_call(endpoint: FailingEndpoint) -> None:
    endpoint.answer = (200, b"<<not xml")
    with pytest.raises(InfrastructureError) as err, aws.aws_errors("list the pools"):
        client("ec2", config=retry_config(max_attempts=1)).describe_instances()
    assert str(err.value).startswith("cannot list the pools (DescribeInstances: the answer is not AWS's format: <")
    assert aws.kind(err.value.__cause__) == "server"  # type: ignore[arg-type]


@pytest.mark.parametrize("answer", [(500, ERROR_PAGE), (200, b"<<not xml")])
def test_the_cli_reports_a_failing_endpoint_as_a_sentence_and_exit_3(
    endpoint: FailingEndpoint, answer: tuple[int, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint.answer = answer
    assert run(["pool", "list"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("calque: error: cannot ") and "DescribeAutoScalingGroups: " in err
    assert "Traceback" not in err and "the endpoint failed on its side" in err
