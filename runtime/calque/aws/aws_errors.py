"""The one place botocore errors become calque errors.

``error_code`` reads an AWS error's code; ``kind`` sorts it (not found, throttled, access denied,
capacity, quota, a lost conditional write, a request AWS calls invalid, a server error, unreachable,
other; an answer botocore cannot parse, an HTML error page from a proxy or a failing moto, is a
server error too);
``translate`` turns it into the ``CalqueError`` subclass the CLI maps to an exit code, with a
sentence that says what was being done and what a person can do about it; ``aws_errors`` is
``translate`` as a context manager. Code that genuinely branches on an error (a missing queue is
``None``, a capacity error moves a launch to the next subnet) asks ``kind``/``is_*`` first.
Throttling and 5xx are retried by botocore's standard mode (``calque.aws.clients``) before they get
here. Every message names the AWS call that failed (``DescribeInstances``): a ``ClientError``
carries it, and ``name_the_call`` (registered by the client factory) writes it onto the errors that
do not, such as a parser's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from botocore.parsers import ResponseParserError

from calque.errors import CalqueError, InfrastructureError, UsageError

__all__ = ["AWS_ERRORS", "BotoCoreError", "ClientError", "ResponseParserError"]  # the door's names for botocore's

# every way a boto3 call fails (a parser's error is not a BotoCoreError): code outside calque.aws catches these
# by these names, so botocore is imported nowhere else (tests/unit/test_runtime_structure.py)
AWS_ERRORS: tuple[type[Exception], ...] = (ClientError, BotoCoreError, ResponseParserError)

Kind = Literal[
    "not_found",
    "throttled",
    "access_denied",
    "capacity",
    "quota",
    "precondition",
    "invalid",
    "server",
    "unreachable",
    "other",
]
AWS_ERRORS = (ClientError, BotoCoreError, ResponseParserError)  # what botocore raises for a failed call

NOT_FOUND_CODES = frozenset(
    {
        "404",
        "NoSuchKey",
        "NotFound",
        "NoSuchBucket",
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "NonExistentQueue",
        "ParameterNotFound",
        "InvalidInstanceID.NotFound",
        "InvalidAMIID.NotFound",
    }
)
THROTTLED_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "SlowDown",
        "ProvisionedThroughputExceededException",
    }
)
ACCESS_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "UnauthorizedOperation",
        "AuthFailure",
        "InvalidClientTokenId",
        "ExpiredToken",
        "ExpiredTokenException",
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
        "OptInRequired",
    }
)
# "Not here, try elsewhere": capacity, offering and spot-market errors of RunInstances.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientCapacity",
        "InsufficientSpotInstanceCapacity",
        "Unsupported",
        "SpotMaxPriceTooLow",
        "InvalidSpotInstanceRequest.MaxPriceTooLow",
    }
)
# Account limits: they take out every candidate under the same quota (class and market).
QUOTA_CODES = frozenset({"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"})
# A conditional write lost to another writer: S3 answers 412, or 409 when two race for the same key.
PRECONDITION_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})
_INVALID_PREFIXES = ("Invalid", "Malformed", "MissingParameter", "Validation")
# AWS's own failures (HTTP 5xx); S3 and SQS over a bare 5xx name the status as the code
SERVER_CODES = frozenset({"InternalError", "InternalFailure", "InternalServerError", "ServiceUnavailable"})
_CALL_ATTR = "calque_aws_call"  # where name_the_call writes the operation's name on an exception


class StoreError(InfrastructureError):
    """S3 failed (not a missing object: those are ``None``/``False``); ``calque.aws.store``'s error."""


_ADVICE: dict[Kind, str] = {
    "not_found": "check the name, the region and the endpoint",
    "throttled": "AWS throttled the calls even after retries: try again later or lower the parallelism",
    "access_denied": "the AWS credentials in use may not do this: check their IAM policy "
    "(aws sts get-caller-identity shows who they are) or use another profile",
    "capacity": "AWS has no capacity for this right now: try another instance type, subnet or market",
    "quota": "an account limit was reached: request an increase in Service Quotas or ask for less",
    "precondition": "another writer changed the object first: retry",
    "invalid": "AWS refused the request as invalid: fix the settings it names and retry",
    "server": "the endpoint failed on its side, even after retries: retry later; if it persists, see the AWS "
    "Health Dashboard, or the endpoint's own log when it is not AWS (a moto server, a proxy)",
    "unreachable": "check the network, the region and the endpoint URL",
    "other": "retry; if it persists, the message above is AWS's own",
}


def error_code(exc: BaseException) -> str:
    """The AWS error code of ``exc`` (``NoSuchKey``, ``Throttling``...), or ``""`` when it has none."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def _status(exc: BaseException) -> int | None:
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status is not None else None
    return None


def kind(exc: BaseException) -> Kind:
    """What sort of failure ``exc`` is, from its code (and HTTP status where S3 sends no code)."""
    if isinstance(exc, NoCredentialsError):
        return "access_denied"
    if isinstance(exc, ResponseParserError):  # an answer that is not AWS's format: an error page
        return "server"
    if isinstance(exc, BotoCoreError):  # no answer from AWS: connection, timeout, endpoint
        return "unreachable"
    code, status = error_code(exc), _status(exc)
    if code in NOT_FOUND_CODES or code.endswith(".NotFound") or status == 404:
        return "not_found"
    if code in THROTTLED_CODES or status == 429:
        return "throttled"
    if code in ACCESS_DENIED_CODES or status == 403:
        return "access_denied"
    if code in CAPACITY_CODES:
        return "capacity"
    if code in QUOTA_CODES:
        return "quota"
    if code in PRECONDITION_CODES or status in (409, 412):
        return "precondition"
    if code.startswith(_INVALID_PREFIXES):
        return "invalid"
    if code in SERVER_CODES or (status or 0) >= 500 or code.startswith("5"):
        return "server"
    return "other"


def is_not_found(exc: BaseException) -> bool:
    return kind(exc) == "not_found"


def is_precondition_failed(exc: BaseException) -> bool:
    return kind(exc) == "precondition"


def name_the_call(exception: BaseException, event_name: str, **_kwargs: Any) -> None:
    """botocore ``after-call-error.<service>.<Operation>`` handler: write the call's name onto ``exception``.

    A ``ClientError`` names its operation itself; a parser's or a connection's error does not, and
    a message saying only "invalid XML received" leaves a person to guess which of a task's calls failed.
    """
    op = event_name.rsplit(".", 1)[-1] if event_name.count(".") >= 2 else ""
    if op and not hasattr(exception, _CALL_ATTR):
        setattr(exception, _CALL_ATTR, op)


def call_name(exc: BaseException) -> str | None:
    """``"DescribeInstances"``: the AWS call ``exc`` came from, where known."""
    named = getattr(exc, _CALL_ATTR, None)
    if named:
        return str(named)
    op = getattr(exc, "operation_name", None)
    return str(op) if op else None


def _shorten(text: str, limit: int = 160) -> str:
    """An HTML error page as one readable line: tags and runs of blanks gone, at most ``limit`` characters."""
    plain = " ".join(re.sub(r"<[^>]*>", " ", text).split())
    return plain if len(plain) <= limit else plain[: limit - 1] + "…"


def describe(exc: BaseException) -> str:
    """AWS's own words for ``exc``: ``Code: message`` for an AWS error, the text otherwise."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        return f"{err.get('Code', '?')}: {_shorten(str(err.get('Message') or exc))}"
    if isinstance(exc, ResponseParserError):
        body = str(exc).split("\n")[-1].removeprefix("b'").removesuffix("'")  # botocore quotes the body's bytes
        return "the answer is not AWS's format: " + (_shorten(body) or "an empty body")
    return str(exc)


def translate(
    exc: BaseException, doing: str, *, error: type[CalqueError] = InfrastructureError, missing: str | None = None
) -> CalqueError:
    """The calque error for ``exc``, raised while trying to ``doing`` (``"read s3://b/k"``).

    The caller's input or credentials (an invalid request, access denied) become ``UsageError``;
    everything else becomes ``error`` (``InfrastructureError`` or a subclass such as ``StoreError``).
    ``missing``: the sentence for a name the caller gave that AWS does not know (a ``UsageError``).
    """
    k = kind(exc)
    if missing is not None and k in ("not_found", "invalid"):
        return UsageError(f"{missing} ({describe(exc)})")
    # EC2 names a missing id the caller gave "Invalid...NotFound": that is the caller's input too
    caller = k in ("invalid", "access_denied") or error_code(exc).startswith(_INVALID_PREFIXES)
    cls = UsageError if caller else error
    if isinstance(exc, NoCredentialsError):
        return UsageError(f"cannot {doing}: no AWS credentials found; set AWS_PROFILE or configure credentials")
    call = call_name(exc)
    said = f"{call}: {describe(exc)}" if call else describe(exc)
    return cls(f"cannot {doing} ({said}): {_ADVICE[k]}")


def translate_any(exc: BaseException, doing: str = "call AWS") -> CalqueError | None:
    """``translate(exc, doing)`` when ``exc`` is botocore's, else None (the CLI root's last resort)."""
    return translate(exc, doing) if isinstance(exc, AWS_ERRORS) else None


@contextmanager
def aws_errors(
    doing: str, *, error: type[CalqueError] = InfrastructureError, missing: str | None = None
) -> Iterator[None]:
    """Run the block; a botocore error in it is raised again as ``translate(exc, doing, ...)``."""
    try:
        yield
    except AWS_ERRORS as exc:
        raise translate(exc, doing, error=error, missing=missing) from exc
