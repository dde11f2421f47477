"""What every operation returns: ``Outcome``, the one result both Ansible modules and CLI verbs render.

``changed``/``before``/``after`` are what a person compares (Ansible's diff); ``actions`` what was
done (or, in check mode, would be done); ``pending`` a step calque will not take on its own (a GPU
reset or a reboot); ``failure`` the part that could not be done after something may already have
changed. ``result`` carries the resource's own facts (a queue's URL, the MIG devices).
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field

from calque.errors import CalqueError
from calque.models.base import CalqueModel

Pending = Literal["reset", "reboot"]
R = TypeVar("R", bound=BaseModel)


class Failure(CalqueModel):
    """Why an operation did not finish, and the exit code the CLI (and ``calque_exit_code``) reports."""

    message: str
    exit_code: int = Field(1, ge=1, le=255)


class OperationFailed(CalqueError):
    """An Outcome's ``failure`` raised for the CLI root, with the failure's own exit code."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.exit_code = failure.exit_code


class Outcome(CalqueModel, Generic[R]):
    """The result of one operation, or, with ``check_mode``, its plan rendered without side effects."""

    version: int = 1
    resource: str = Field(description="the operation's name: pool_queue, cohort, mig, mps, pool_spec, runtime")
    check_mode: bool = False
    changed: bool
    before: dict[str, Any] = Field(default_factory=dict, description="what the user cares about, before")
    after: dict[str, Any] = Field(default_factory=dict, description="the same, after (predicted in check mode)")
    actions: list[str] = Field(default_factory=list, description="one sentence per action taken or planned")
    warnings: list[str] = Field(default_factory=list)
    pending: Pending | None = Field(None, description="a GPU reset or a reboot calque left to the caller")
    failure: Failure | None = None
    result: R

    def raise_for_failure(self) -> None:
        """Raise ``OperationFailed`` when the operation failed (the CLI's one path to its exit code)."""
        if self.failure is not None:
            raise OperationFailed(self.failure)
