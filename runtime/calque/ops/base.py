"""The shape of an operation: a request model, ``plan(request) -> Plan``, ``apply(plan) -> Outcome``.

``check(plan)`` renders a plan as an Outcome with no side effects (Ansible's check mode, a CLI's
``plan``/``--check``); ``run(request, check_mode)`` is the one call a module or a verb makes.
An operation gets what it cannot build from its request at construction: AWS access (from
amazon.aws's module options or the CLI's --region/--endpoint-url/--profile) and a progress sink.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from calque.errors import UsageError, format_validation_error
from calque.models.base import CalqueModel
from calque.ops.outcome import Outcome

Progress = Callable[[str], None]
Req = TypeVar("Req", bound=CalqueModel)
P = TypeVar("P")
R = TypeVar("R", bound=BaseModel)
M = TypeVar("M", bound=BaseModel)


class AwsAccess(Protocol):
    """Where an AWS operation gets its clients: the CLI's session, or an Ansible module's connection."""

    region: str | None
    endpoint_url: str | None
    profile: str | None

    def client(self, service: str) -> Any: ...


@dataclass
class AwsSession:
    """AWS access from region, endpoint and profile, through ``calque.aws.clients`` (offline-checked)."""

    region: str | None = None
    endpoint_url: str | None = None
    profile: str | None = None

    def client(self, service: str) -> Any:
        from calque.aws.clients import client

        return client(service, region=self.region, endpoint_url=self.endpoint_url, profile=self.profile)


class Operation(Generic[Req, P, R]):
    """One declarative operation on one kind of resource."""

    name: ClassVar[str]
    Request: ClassVar[type[CalqueModel]]

    def __init__(self, aws: AwsAccess | None = None, progress: Progress | None = None) -> None:
        self._aws = aws
        self.say: Progress = progress or (lambda _msg: None)

    @property
    def aws(self) -> AwsAccess:
        if self._aws is None:
            self._aws = AwsSession()
        return self._aws

    def request(self, params: dict[str, Any]) -> Req:
        """``params`` validated as this operation's request, or a UsageError naming each bad option."""
        try:
            req: Req = self.Request.model_validate(params)  # type: ignore[assignment]
        except ValidationError as exc:
            raise UsageError(format_validation_error(exc, f"invalid {self.name} options")) from None
        return req

    def plan(self, request: Req) -> P:
        raise NotImplementedError

    def check(self, plan: P) -> Outcome[R]:
        raise NotImplementedError

    def apply(self, plan: P) -> Outcome[R]:
        raise NotImplementedError

    def run(self, request: Req, *, check_mode: bool = False) -> Outcome[R]:
        plan = self.plan(request)
        return self.check(plan) if check_mode else self.apply(plan)


def validated(model: type[M], data: dict[str, Any], what: str, renamed: dict[str, str] | None = None) -> M:
    """``model`` from ``data``, or a UsageError in the caller's option names (``renamed``: field -> option)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        if renamed:
            exc = _renamed(exc, renamed)
        raise UsageError(format_validation_error(exc, what)) from None


def _renamed(exc: ValidationError, renamed: dict[str, str]) -> ValidationError:
    from pydantic_core import InitErrorDetails, PydanticCustomError

    details: list[InitErrorDetails] = []
    for err in exc.errors():
        loc = tuple(renamed.get(str(p), p) if i == 0 else p for i, p in enumerate(err["loc"]))
        msg = str(err["msg"]).removeprefix("Value error, ")
        details.append(InitErrorDetails(type=PydanticCustomError(err["type"], msg), loc=loc, input=err.get("input")))
    return ValidationError.from_exception_data(exc.title, details)
