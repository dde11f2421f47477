"""The typed session client: each operation's typed arguments in, its typed answer out.

``SessionClient`` is ``wire.SessionSocket`` (the socket, who answers, the envelope) plus the contracts
of ``calque.models.session``: ``typed`` checks a request's arguments by the rules the daemon checks
again, and every answer is validated into its model. ``call`` sends a raw one (tests, and the retry
rules, use it). ``calque session status`` and ``list`` print from ``views.py`` instead, without
pydantic; their ``--json`` comes from here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from calque.errors import InfrastructureError, RefusedError, UsageError
from calque.models.session import (
    BudgetOverrideArgs,
    CheckoutArgs,
    Drain,
    DrainArgs,
    Drained,
    ExtendArgs,
    LedgerArgs,
    ReleaseArgs,
    ReportArgs,
    RequestArgs,
    Session,
    SessionRefArgs,
    SliceState,
    UndrainArgs,
    error_kind,
)
from calque.models.session_answers import Adopted, DoorState, MetricsText, WhoAmI
from calque.session.wire import (
    SERVICE_USER_ENV,
    NoFreeSliceError,
    SessionSocket,
    check_peer,
    default_socket,
    trusted_server_uids,
)

if TYPE_CHECKING:
    from calque.models.ledger import HostLedger, LabSpend
    from calque.models.session import UsageReport

__all__ = [
    "SERVICE_USER_ENV",
    "NoFreeSliceError",
    "SessionClient",
    "check_peer",
    "default_socket",
    "trusted_server_uids",
    "typed",
]

A = TypeVar("A", bound=RequestArgs)


def typed(model: type[A], **args: Any) -> A:
    """``model``'s arguments, checked here by the rules the daemon checks again: a broken rule is a
    UsageError (exit 2), or a RefusedError (exit 4) for a rule that refuses (MPS without consent)."""
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        why = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise (RefusedError if error_kind(exc) == "refused" else UsageError)(why) from exc


class SessionClient(SessionSocket):
    # -- each operation, typed ----------------------------------------------------------------------

    def checkout(self, args: CheckoutArgs) -> Session:
        return Session.model_validate(self.call("checkout", **args.model_dump()))

    def checkin(self, session_id: str | None = None) -> Session:
        return Session.model_validate(self.call("checkin", **typed(SessionRefArgs, id=session_id).model_dump()))

    def extend(self, session_id: str | None, by: str | float) -> Session:
        return Session.model_validate(self.call("extend", **typed(ExtendArgs, id=session_id, by=by).model_dump()))

    def status(self) -> list[Session]:
        """The caller's live sessions."""
        return [Session.model_validate(s) for s in self.call("status")]

    def list_slices(self) -> list[SliceState]:
        """Every slice on the host, busy or free; holders and session ids for root and admins (and the
        caller's own): as root, every live session on the host."""
        return [SliceState.model_validate(s) for s in self.call("list")]

    def release(self, session_id: str, reason: str | None = None) -> Session:
        """End anyone's session now (root or the admin group only); ``reason`` goes to the audit trail."""
        args = typed(ReleaseArgs, id=session_id, force=True, reason=reason)
        return Session.model_validate(self.call("release", **args.model_dump()))

    def report(self, since: str | float = "7d") -> UsageReport:
        from calque.models.session import UsageReport

        return UsageReport.model_validate(self.call("report", **typed(ReportArgs, since=since).model_dump()))

    def ledger(self, since: str | float = "30d") -> HostLedger:
        """This host's usage events over ``since``, priced (yours only unless you are an admin)."""
        from calque.models.ledger import HostLedger

        return HostLedger.model_validate(self.call("ledger", **typed(LedgerArgs, since=since).model_dump()))

    def budget_override(self, lab: str, extra: float, reason: str) -> LabSpend:
        """An admin's audited extra allowance for ``lab`` this month; the lab's state after it."""
        from calque.models.ledger import LabSpend

        args = typed(BudgetOverrideArgs, lab=lab, extra=extra, reason=reason)
        return LabSpend.model_validate(self.call("budget_override", **args.model_dump()))

    def adopt(self, session_id: str | None = None) -> Adopted:
        """Move this very process into the session's cgroup (``calque session run`` then execs)."""
        return Adopted.model_validate(self.call("adopt", **typed(SessionRefArgs, id=session_id).model_dump()))

    def drain(self, reason: str, gpu: int | None = None, by: str | float | None = None) -> Drained:
        """No new checkouts on GPU ``gpu`` (None: the host); with ``by``, its sessions end that soon (admins)."""
        return Drained.model_validate(
            self.call("drain", **typed(DrainArgs, gpu=gpu, by=by, reason=reason).model_dump())
        )

    def undrain(self, gpu: int | None = None) -> list[Drain]:
        """End the drain of ``gpu``, or (None) every drain of the host; the drains ended (admins)."""
        ended = self.call("undrain", **typed(UndrainArgs, gpu=gpu).model_dump())
        return [Drain.model_validate(d) for d in ended]

    def drains(self) -> list[Drain]:
        return [Drain.model_validate(d) for d in self.call("drains")]

    def door(self) -> DoorState | None:
        """How a checkout here is made now (``models/session_answers.py``); None from a daemon that
        predates the institution's queue (it serves every checkout directly)."""
        try:
            return DoorState.model_validate(self.call("door"))
        except ValidationError:
            # Not a door answer (a daemon of the caller's own making answers anything): serve directly;
            # the daemon, not this answer, decides whether a direct checkout is allowed.
            return None
        except (UsageError, InfrastructureError) as exc:
            if "door" in str(exc):  # an older daemon names the operation it does not know
                return None
            raise

    def whoami(self) -> WhoAmI:
        return WhoAmI.model_validate(self.call("whoami"))

    def metrics(self) -> str:
        """The Prometheus text (live sessions per user only in an admin's answer)."""
        return MetricsText.model_validate(self.call("metrics")).text
