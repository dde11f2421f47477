"""A host's MIG demand over a window, as ``calque gpu mig suggest`` hands it to ``calque.gpu.suggest``:
MIG sessions and refused asks by profile. Read from a session registry by
``calque.session.client.history.read_history``; the GPU layer takes it as data and reads no registry."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Use:
    """One MIG session overlapping the window (a live one runs to the window's end)."""

    session_id: str
    profile: str
    gpu: int
    start: float
    end: float


@dataclass(frozen=True)
class Refusal:
    """One ask refused for want of a free slice: its profile ('' for any), its tries, the session a later try got."""

    profile: str
    first_at: float
    last_at: float
    attempts: int
    granted: str | None = None


@dataclass(frozen=True)
class History:
    path: str
    since: float
    until: float
    recorded_since: float | None  # when the registry began recording refusals
    uses: list[Use] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)

    @property
    def refusals_known_from(self) -> float:
        """The start of the part of the window in which refusals were recorded."""
        return max(self.since, self.recorded_since or self.since)
