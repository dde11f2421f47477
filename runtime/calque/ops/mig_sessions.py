"""The MIG layout operation's one door to the host's session daemon: which MIG devices live sessions
hold, draining the GPUs a layout changes (no new checkouts there while it waits and applies) and
undraining them after, and ending sessions (reason ``layout``) before a forced layout destroys their devices.

Only through the daemon's socket with the session client (its ``list`` and admin ``release`` ops),
never by reading its registry behind its back: the daemon owns its sessions, their notices, audit and
usage. A host where no daemon answers has no session to protect (nothing is checked out there).
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable
from pathlib import Path

from calque.errors import RefusedError, UnreachableError
from calque.gpu.migmodels import SliceHolder
from calque.models.session import Drain
from calque.session.client import SessionClient, default_socket

LAYOUT_REASON = "layout"


class SessionDaemon:
    """The session daemon at ``socket`` (``CALQUE_SESSION_SOCKET`` or the packaged default when None)."""

    def __init__(self, socket: str | None = None) -> None:
        self.path = Path(socket) if socket else default_socket()

    def _client(self) -> SessionClient:
        return SessionClient(self.path, timeout=30.0, retry_for=1.0)

    def holders(self) -> tuple[dict[str, list[SliceHolder]], str | None]:
        """Live sessions on MIG devices by device UUID, and a note when no daemon answers."""
        if not self.path.exists():
            return {}, f"no session service at {self.path} (none configured or not running): no session to protect"
        try:
            listed = self._client().list_slices()
        except UnreachableError as exc:
            cause = exc.__cause__
            if not isinstance(cause, OSError) or cause.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise  # a daemon may be there (a socket this user cannot open): never guess "no sessions"
            return {}, f"no session service answers at {self.path} (not running): no session to protect"
        out: dict[str, list[SliceHolder]] = {}
        for state in listed:
            sl = state.slice
            if not state.busy or sl.kind != "mig" or not sl.mig_uuid:
                continue
            out.setdefault(sl.mig_uuid, []).append(
                SliceHolder(
                    mig_uuid=sl.mig_uuid,
                    gpu_index=sl.gpu_index,
                    session_id=state.session_id,
                    holder=state.holder,
                    holder_uid=state.holder_uid,
                    ends=state.busy_until,
                )
            )
        return out, None

    def end_for_layout(self, holders: Iterable[SliceHolder], say: Callable[[str], None]) -> list[str]:
        """End each session (the daemon notifies its holder, audits it and records its usage); raises
        (RefusedError for a caller who is not root or a daemon admin) before the layout touches a device."""
        ended = []
        client = self._client()
        for h in holders:
            if h.session_id is None:  # only root and the daemon's admins see ids, and only they may end one
                raise RefusedError(
                    f"GPU {h.gpu_index}: {h.mig_uuid} is held by a session this user cannot see or end: "
                    "run the layout change as root"
                )
            say(f"GPU {h.gpu_index}: ending session {h.session_id} of {h.holder} (reason {LAYOUT_REASON})")
            client.release(h.session_id, reason=LAYOUT_REASON)
            ended.append(h.session_id)
        return ended

    def drains(self) -> list[Drain]:
        return self._client().drains()

    def drain(self, gpu: int, reason: str) -> None:
        """No new checkouts on ``gpu``; its live sessions run to their own deadlines (admins only)."""
        self._client().drain(reason, gpu=gpu)

    def undrain(self, gpu: int) -> None:
        self._client().undrain(gpu)
