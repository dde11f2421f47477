"""One validation-error formatter and one botocore-error translator, each tried on real failures."""

from __future__ import annotations

import socket

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError
from calque.aws import aws_errors as aws
from calque.aws.aws_errors import StoreError
from calque.aws.clients import client, retry_config
from calque.aws.queue import PoolQueue
from calque.aws.store import RunStore
from calque.errors import InfrastructureError, UsageError, format_validation_error
from calque.models import PoolSpec
from pydantic import ValidationError


def _client_error(code: str, status: int = 400, op: str = "Op") -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": f"{code} happened"}, "ResponseMetadata": {"HTTPStatusCode": status}}, op
    )


def test_every_problem_is_named_by_field_after_the_source() -> None:
    with pytest.raises(ValidationError) as err:
        PoolSpec.model_validate({"model": "", "bucket": "bkt", "queue": {"receive_wait": 99}, "worker": 1})
    text = format_validation_error(err.value, "pool spec /etc/calque/pool.yaml")
    assert text.startswith("pool spec /etc/calque/pool.yaml: ")
    for part in ("model='': String should have at least 1 character; change model",
                 "workload: Field required; set workload",
                 "queue.receive_wait=99: Input should be less than or equal to 20; change queue.receive_wait",
                 "worker=1: Extra inputs"):  # fmt: skip
        assert part in text, part


def test_a_validator_sentence_loses_pydantics_prefix() -> None:
    with pytest.raises(ValidationError) as err:
        PoolSpec.model_validate({"model": "m", "workload": "w", "bucket": "bkt", "workers": 2,
                                 "cuda_visible_devices": ["0"]})  # fmt: skip
    assert format_validation_error(err.value) == (
        "cuda_visible_devices has 1 entries but workers is 2: give one entry per worker"
    )  # a model-level check names no single field


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (_client_error("NoSuchKey", 404), "not_found"),
        (_client_error("", 404), "not_found"),
        (_client_error("AWS.SimpleQueueService.NonExistentQueue"), "not_found"),
        (_client_error("InvalidSubnetID.NotFound"), "not_found"),
        (_client_error("Throttling"), "throttled"),
        (_client_error("SlowDown", 503), "throttled"),
        (_client_error("AccessDenied", 403), "access_denied"),
        (_client_error("UnauthorizedOperation"), "access_denied"),
        (_client_error("InsufficientInstanceCapacity", 500), "capacity"),
        (_client_error("VcpuLimitExceeded"), "quota"),
        (_client_error("PreconditionFailed", 412), "precondition"),
        (_client_error("InvalidParameterValue"), "invalid"),
        (_client_error("InternalError", 500), "server"),
        (_client_error("500", 500), "server"),
        (_client_error("SomethingNew", 400), "other"),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), "unreachable"),
        (NoCredentialsError(), "access_denied"),
    ],
)
def test_errors_are_sorted_by_kind(exc: Exception, kind: str) -> None:
    assert aws.kind(exc) == kind


@pytest.mark.parametrize(
    ("code", "cls", "advice"),
    [
        ("AccessDenied", UsageError, "IAM policy"),
        ("InvalidParameterValue", UsageError, "fix the settings"),
        ("InvalidAMIID.NotFound", UsageError, "check the name"),
        ("Throttling", InfrastructureError, "try again later"),
        ("InsufficientInstanceCapacity", InfrastructureError, "another instance type"),
        ("VcpuLimitExceeded", InfrastructureError, "Service Quotas"),
        ("InternalError", InfrastructureError, "retry later"),
    ],
)
def test_translate_picks_the_calque_error_and_says_what_to_do(code: str, cls: type, advice: str) -> None:
    err = aws.translate(_client_error(code), "launch cohort lab")
    assert type(err) is cls
    assert str(err).startswith(f"cannot launch cohort lab (Op: {code}: {code} happened): ") and advice in str(err)


def test_translate_keeps_the_callers_error_class_for_aws_failures() -> None:
    with pytest.raises(StoreError, match="cannot write s3://b/k"), aws.aws_errors("write s3://b/k", error=StoreError):
        raise _client_error("InternalError", 500)


def test_missing_credentials_say_how_to_give_some() -> None:
    err = aws.translate(NoCredentialsError(), "read s3://b/k")
    assert isinstance(err, UsageError) and "no AWS credentials found" in str(err)


def test_a_missing_bucket_is_a_store_error_with_a_sentence(moto: str) -> None:
    store = RunStore(client("s3"), "no-such-bucket", "calque", "q")
    with pytest.raises(StoreError) as err:
        store.put("s3://no-such-bucket/calque/x.json", b"{}")
    assert "cannot write s3://no-such-bucket/calque/x.json (PutObject: NoSuchBucket:" in str(err.value)
    assert "check the name, the region and the endpoint" in str(err.value)
    s3 = client("s3")
    s3.create_bucket(Bucket="present")
    assert RunStore(s3, "present", "calque", "q").get("s3://present/calque/missing.json") is None


def test_an_unreachable_endpoint_is_an_infrastructure_error_naming_the_queue(moto: str) -> None:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sqs = client("sqs", endpoint_url=f"http://127.0.0.1:{port}", config=retry_config(max_attempts=1))
    with pytest.raises(InfrastructureError) as err:
        PoolQueue(sqs, "org/model").state()
    assert "cannot look up SQS queue calque-pool-org-model-" in str(err.value)
    assert "check the network, the region and the endpoint URL" in str(err.value)


def test_a_name_aws_does_not_know_is_the_callers_to_fix(moto: str) -> None:
    from calque.aws.acquire.launch_spec import resolve_image
    from calque.models import CohortSpec

    spec = CohortSpec(name="lab", count=1, instance_types=["g6.xlarge"], ami_ssm_parameter="/no/such/ami")
    with pytest.raises(UsageError) as err:
        resolve_image(client("ec2"), client("ssm"), spec)
    assert str(err.value).startswith(
        "SSM parameter '/no/such/ami' does not exist in this region; give ami or another ami_ssm_parameter "
        "(ParameterNotFound:"
    )
    with pytest.raises(UsageError, match=r"AMI 'ami-12345678' cannot be used in this region \(InvalidAMIID"):
        resolve_image(client("ec2"), client("ssm"), spec.model_copy(update={"ami": "ami-12345678"}))


def test_a_stale_receipt_handle_is_a_lost_lease_not_a_request_to_fix(moto: str) -> None:
    from calque.models import QueueSettings

    q = PoolQueue(client("sqs"), "org/model")
    q.ensure(QueueSettings(visibility_timeout=30, receive_wait=0, encryption=False))
    q.sqs.send_message(QueueUrl=q.url(), MessageBody="{}")
    (msg,) = q.receive(1)
    q.ack(msg["ReceiptHandle"])
    with pytest.raises(InfrastructureError) as err:
        q.extend(msg["ReceiptHandle"], 30)
    assert type(err.value) is InfrastructureError
    assert "the message is no longer held by this worker" in str(err.value)
    assert "its visibility ran out or another worker received it" in str(err.value)
