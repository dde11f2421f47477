"""The MIG layout operation's one door to the host's session daemon: which MIG devices live sessions
hold, draining the GPUs a layout changes (no new checkouts there while it waits and applies) and
undraining them after, and ending sessions (reason ``layout``) before a forced layout destroys their devices.

Only through the daemon's socket with the session client (its ``list`` and admin ``release`` ops),
never by reading its registry behind its back: the daemon owns its sessions, their notices, audit and
usage. A host with no session service (no session config, no socket) has no session to protect. A host
whose daemon is configured but does not answer (stopped, crashed) may hold sessions no one can list:
``silent`` says so, and the layout operation refuses to destroy instances there without force.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable
from pathlib import Path

from calque.errors import RefusedError, UnreachableError
from calque.gpu.migmodels import SliceHolder
from calque.models.session import Drain
from calque.session.client import SessionClient, default_socket
from calque.session.paths import DEFAULT_CONFIG

LAYOUT_REASON = "layout"
UNIT = "calque-session.service"


class SessionDaemon:
    """The session daemon at ``socket`` (else the one ``config`` names, else ``CALQUE_SESSION_SOCKET`` or the
    packaged default); ``config`` is its configuration file (default ``/etc/calque/session.yaml``): where it
    exists, a daemon is expected on this host."""

    def __init__(self, socket: str | None = None, config: str | None = None) -> None:
        self.config = Path(config) if config else DEFAULT_CONFIG
        self.path = Path(socket) if socket else (self._configured_socket() or default_socket())
        # Set by ``holders``: why a daemon this host is configured for cannot say who holds what (None: it answered,
        # or no session service is set up here).
        self.silent: str | None = None

    def _configured_socket(self) -> Path | None:
        from calque.errors import CalqueError
        from calque.session.session_config import load_config

        if not self.config.exists():
            return None
        try:
            return load_config(self.config).socket
        except CalqueError:  # a broken config still means a daemon is meant to run here, at the default socket
            return None

    def _client(self) -> SessionClient:
        return SessionClient(self.path, timeout=30.0, retry_for=1.0)

    def _not_answering(self, why: str) -> str:
        """The note for a daemon that does not answer; ``silent`` set where one is expected (its config
        exists, or its socket is left over from a daemon that stopped answering)."""
        expected = self.config.exists() or self.path.exists()
        if not expected:
            self.silent = None
            return f"no session service on this host (no {self.config}, nothing at {self.path}): no session to protect"
        where = f"configured in {self.config}" if self.config.exists() else "its socket left behind"
        self.silent = (
            f"the session daemon ({UNIT}, {where}) {why} at {self.path}: calque cannot see "
            f"which sessions hold the slices this layout destroys. Start it (systemctl start {UNIT}) and run "
            "the layout again; or force it (--force; calque_gpu_layout_force: true in the calque.gpu.gpu_layout role), "
            "which destroys them unseen and the daemon, once started, ends their sessions as vanished"
        )
        return self.silent

    def holders(self) -> tuple[dict[str, list[SliceHolder]], str | None]:
        """Live sessions on MIG devices by device UUID, and a note when no daemon answers (``silent`` then says
        whether one should have)."""
        self.silent = None
        if not self.path.exists():
            return {}, self._not_answering("is not running (no socket)")
        try:
            listed = self._client().list_slices()
        except UnreachableError as exc:
            cause = exc.__cause__
            if not isinstance(cause, OSError) or cause.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise  # a daemon may be there (a socket this user cannot open): never guess "no sessions"
            return {}, self._not_answering("does not answer (connection refused)")
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
