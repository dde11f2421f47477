"""How a replayed holder uses its session, and what idle reclaim did to it (issue 37 part 2's reclaim column).

The trace records when each task held its GPU (``scheduled_time`` to ``deletion_time``), not how busy it
kept it; so the replay's holder is busy for the task's run time (the simulator's utilisation 100 % on
its slice) and idle after it (0 %). What it does then is the holder model, printed at the top:

- ``booked`` (the default): it asked for its run time rounded up to whole hours (people book ``--ttl
  1h``, ``2h``, not 11 minutes) and never checks in early: its slice sits idle until the TTL ends, unless
  idle reclaim ends it first. The idle it adds comes from the trace's run times, not from a share of
  forgetful holders picked by hand;
- ``prompt``: it checks in the moment its work ends (no idle time at all: reclaim can only cost).

Both are shown by the bench (``--holders``); the reclaim column's figures come from each host's own
audit trail (``idle`` ends), read after the replay.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

HOLDERS = ("booked", "prompt")
HOLDER_WORDS = {
    "booked": "busy (utilisation 100 %) for the task's run time, then idle (0 %) until its TTL ends: the TTL it asked "
    "is the run time rounded up to whole hours, and it never checks in early",
    "prompt": "busy (utilisation 100 %) for the task's run time, then checks in at once (no idle time)",
}


def booked_s(run_s: float, holders: str) -> float:
    """Trace seconds the holder keeps its session unless something ends it first."""
    if holders == "prompt":
        return run_s
    if holders == "booked":
        return max(1, math.ceil(run_s / 3600)) * 3600.0
    raise ValueError(f"no holder model {holders!r}: choose from {', '.join(HOLDERS)}")


@dataclass(frozen=True)
class End:
    event: str  # checkin, expiry, idle, ...
    at: float  # epoch seconds


def read_ends(audit: Path) -> dict[str, End]:
    """Each session's end on one host, from its audit trail (the first end event each session has)."""
    ends: dict[str, End] = {}
    if not audit.is_file():
        return ends
    for raw in audit.read_text().splitlines():
        try:
            e = json.loads(raw)
            if e.get("event") in {"checkin", "expiry", "idle", "release", "vanished", "drained"}:
                ends.setdefault(e["session"], End(e["event"], datetime.fromisoformat(e["ts"]).timestamp()))
        except (ValueError, KeyError, TypeError):
            continue  # a line the bench cannot read is no end it can count
    return ends
