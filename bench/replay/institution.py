"""The institution the trace is replayed on: its hosts, their cards' MIG layouts, its labs and shares,
and the queue's rules scaled by the compression factor (printed at the top of the output)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .mapping import SEVENTHS, Window

# Each host: two A100-40GB cards, one whole (7g.40gb) and one cut 4g.20gb + 3g.20gb. Why: in the trace's
# fractional asks about 45 % need more than 4/7 of a card (0.59-0.81), 30 % fit 4g, the rest 3g or less.
CARDS: tuple[tuple[str, ...], ...] = (("7g.40gb",), ("4g.20gb", "3g.20gb"))
POLICIES = ("fifo", "fair", "fair-4h", "fair-reclaim", "fair-reserve")
AGING_S = {"fifo": 1800.0, "fair": 1800.0, "fair-4h": 4 * 3600.0, "fair-reclaim": 1800.0, "fair-reserve": 1800.0}
RESERVED = ("ls", "7g.40gb", 1)  # (lab, profile, slices) the fair-reserve row's class reservation holds
RELEASE_UNUSED_S = 900.0  # 15 trace min: an unused reserved slice goes back to the queue
IDLE_FOR_S = 1800.0  # the daemon's default idle.for (30 min)
POLICY_WORDS = {
    "fifo": "FIFO only: institution.yaml with no labs, so every user is in lab 'default' and the broker's order "
    "is arrival order",
    "fair": "fair share: one lab per QoS class, each a Unix group, with the shares below; the broker orders labs "
    "by usage over the fair-share window per share, FIFO inside a lab; a request waiting past the aging bound (the "
    "broker's default, 30 min) goes ahead of every later one",
    "fair-4h": "fair share as above with the aging bound at 4 h (queue.aging: 4h): fair share ordering for longer",
    "fair-reclaim": "fair share as 'fair', and every host daemon's idle reclaim on (session.yaml idle: the daemon's "
    "defaults, below 5 %, memory_from 64 MiB, for 30 min (/ compression); warn 0: the notice has no terminal to "
    "reach); the daemon reads the simulated utilisation once a replay second",
    "fair-reserve": "fair-reclaim, and a class reservation made through the broker (calque session reserve) for the "
    f"whole window: lab {RESERVED[0]}'s group holds {RESERVED[2]} x {RESERVED[1]} (its members go first on it), "
    f"handed back to the queue when unused for {RELEASE_UNUSED_S / 60:g} trace min",
}


@dataclass(frozen=True)
class Shape:
    hosts: int
    shares: dict[str, float]  # lab -> share

    @property
    def offered(self) -> tuple[str, ...]:
        return tuple(sorted({p for card in CARDS for p in card}, key=lambda p: SEVENTHS[p]))

    @property
    def sevenths(self) -> int:
        """The institution's compute, in sevenths of an A100 (what the allocation ratio is a share of)."""
        return self.hosts * sum(SEVENTHS[p] for card in CARDS for p in card)

    def queue_rules(self, window: Window, policy: str = "fair") -> dict[str, Any]:
        """The broker's defaults (7-day fair-share window, 60 s claim window) and the policy's aging bound,
        in replay time."""
        c = window.compression
        return {
            "fair_share_window": max(7 * 86400 / c, 1.0),
            "aging": max(AGING_S[policy] / c, 0.5),
            "claim_window": max(60 / c, 1.0),
            "assumed_ttl": max(3600 / c, 1.0),
            "max_queued_per_user": 1000,
        }

    def idle_rule(self, window: Window, policy: str) -> dict[str, Any] | None:
        """session.yaml's ``idle`` for the policy (None: reclaim off), in replay time."""
        if policy not in ("fair-reclaim", "fair-reserve"):
            return None
        return {"for": max(IDLE_FOR_S / window.compression, 1.0), "warn": 0}

    def institution_doc(self, policy: str, groups: dict[str, str]) -> dict[str, Any]:
        doc: dict[str, Any] = {"version": 1}
        if policy.startswith("fair"):
            doc["labs"] = [{"name": lab, "groups": [groups[lab]], "share": s} for lab, s in self.shares.items()]
        return doc

    def lines(self, window: Window) -> list[str]:
        return [
            f"institution: {self.hosts} hosts x {len(CARDS)} simulated A100-40GB, cards cut "
            + " | ".join("+".join(c) for c in CARDS)
            + f" ({self.hosts * sum(len(c) for c in CARDS)} slices, {self.sevenths} compute sevenths)",
            "labs and shares: " + ", ".join(f"{lab} {s:g}" for lab, s in self.shares.items()),
            "queue rules (broker defaults / compression; aging per policy): "
            + ", ".join(f"{k} {v:.3g}" for k, v in self.queue_rules(window).items()),
            *(f"policy {p}: {POLICY_WORDS[p]}" for p in POLICIES),
            f"idle reclaim: for {IDLE_FOR_S / 60:g} trace min = "
            f"{max(IDLE_FOR_S / window.compression, 1.0):.3g} replay s; "
            f"the daemon samples once a replay second ({window.compression / 60:.3g} trace min)",
        ]
