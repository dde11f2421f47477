"""Whether each MPS slot's control daemon answers, and what the daemon does when one stops.

A slot is offered only while its GPU's MPS control daemon answers (``calque.gpu.mps_probe``): a
CUDA client whose daemon is gone does not reach MPS at all (it fails, or runs outside MPS without the
slot's limits), so handing the slot out would hand out nothing. Every process asks for itself and
keeps the answer for ``MPS_PROBE_MAX_AGE_S`` per pipe directory, so a checkout costs one connect at
most that often (the worker processes serve checkout, list and status; the main process watches).

A live session whose daemon stops answering stays live: the daemon usually comes back (``systemctl
restart calque-mps@N``), and the slot is still the holder's. The main process (``MpsWatch``, on the
timers' ``reassert_every``) tells each holder on their terminals and in the audit trail
(``mps_down``), and again when it answers (``mps_up``); ``status`` warns and ``list`` marks the
slot unavailable for as long as it is down.
"""

from __future__ import annotations

import logging
import threading
import time

from calque.gpu.mps_probe import why_not_answering
from calque.models.session import Slice
from calque.session.daemon.audit import AuditLog
from calque.session.daemon.notices import notify_terminals
from calque.session.daemon.rows import Held

log = logging.getLogger("calque.session")

MPS_PROBE_MAX_AGE_S = 1.0


def down_message(sl: Slice, why: str) -> str:
    """Why an MPS slot cannot be used now, and what brings it back (the gpu_layout role's unit)."""
    return (
        f"the MPS control daemon of GPU {sl.gpu_index} does not answer ({why}); an administrator restarts it "
        f"(systemctl restart calque-mps@{sl.gpu_index}, or calque gpu mps start --gpus {sl.gpu_index} "
        "--i-understand-shared-gpu-has-no-isolation)"
    )


class MpsDaemons:
    """The last answer of each pipe directory's control daemon, asked again once it is older than
    ``max_age``. Thread-safe; a probe runs outside the lock (it may take up to its timeout)."""

    def __init__(self, max_age: float = MPS_PROBE_MAX_AGE_S) -> None:
        self.max_age = max_age
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, str | None]] = {}

    def why_down(self, sl: Slice) -> str | None:
        """Why ``sl``'s daemon does not answer; None when it does (and for every MIG slice)."""
        pipe = sl.pipe_directory
        if sl.kind != "mps" or not pipe:
            return None
        now = time.monotonic()
        with self._lock:
            hit = self._seen.get(pipe)
        if hit is not None and now - hit[0] <= self.max_age:
            return hit[1]
        why = why_not_answering(pipe)
        with self._lock:
            self._seen[pipe] = (now, why)
        return why

    def unavailable(self, sl: Slice) -> str | None:
        """What a user is told about ``sl`` while its daemon is down (None while it answers)."""
        why = self.why_down(sl)
        return down_message(sl, why) if why is not None else None


class MpsWatch:
    """Main process: tells the holder of each live MPS session when its daemon stops answering, and
    when it answers again (terminals, audit trail, the daemon's log), once per change."""

    def __init__(self, daemons: MpsDaemons, audit: AuditLog) -> None:
        self.daemons = daemons
        self.audit = audit
        self._told_down: dict[str, str] = {}  # session id -> why, while its daemon is down

    def tick(self, live: list[Held]) -> None:
        mps = [h for h in live if h.slice.kind == "mps"]
        for h in mps:
            sid = h.session.id
            why = self.daemons.why_down(h.slice)
            if why is not None and sid not in self._told_down:
                self._told_down[sid] = why
                log.warning("MPS daemon of GPU %d (%s) is down: %s", h.slice.gpu_index, h.slice.pipe_directory, why)
                self._tell(
                    h,
                    "mps_down",
                    why,
                    f"{down_message(h.slice, why)}. CUDA programs started now do not reach MPS; "
                    "the session stays yours",
                )
            elif why is None and sid in self._told_down:
                del self._told_down[sid]
                log.info("MPS daemon of GPU %d (%s) answers again", h.slice.gpu_index, h.slice.pipe_directory)
                self._tell(
                    h, "mps_up", "answers again", f"the MPS control daemon of GPU {h.slice.gpu_index} answers again"
                )
        alive = {h.session.id for h in mps}
        for sid in [s for s in self._told_down if s not in alive]:
            del self._told_down[sid]

    def _tell(self, h: Held, event: str, reason: str, message: str) -> None:
        ttys = notify_terminals(h.session.uid, f"session {h.session.id} on {h.slice.id}: {message}")
        self.audit.record(event, h, by_uid=0, reason=reason, terminals=ttys)
