"""What the hub's spawner asks of the institution, as the hub's service user, for one named user:
the broker for what is offered, her lab's budget left and her slice (``broker/hub.py`` allows it
``anywhere``, ``queue``, ``cancel`` and ``lab`` in her name), the slice's host for her server, her
sessions and her check-in (``session/daemon/crosshost.py``: ``notebook``, ``status``, ``checkin``).
Blocking calls; the spawner runs them in threads. Nothing here imports JupyterHub.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from calque.models.broker import AnywhereArgs, Grant, LabStanding, QueueEntry
from calque.models.institution import Institution
from calque.models.notebook import HUB_ENV_NAME, NotebookStarted
from calque.models.session import Session
from calque.session.client.broker import BrokerClient
from calque.session.institution import load_institution
from calque.session.remote import RemoteHost, new_request_id


@dataclass
class Offer:
    """One choice of the form: a MIG profile (or ``mps``), how many are free now, when one frees next."""

    profile: str
    free: int = 0
    total: int = 0
    next_free: datetime | None = None


@dataclass
class Offers:
    choices: list[Offer] = field(default_factory=list)
    waiting: int = 0  # the user's own requests in the queue
    lab: LabStanding | None = None  # her lab and its budget left, as the broker answers it
    unknown: str | None = None  # why the institution's view is missing (the broker did not answer)


# How a session ended, as its holder is told it (``EndReason``).
ENDED = {
    "checkin": "was checked in",
    "expired": "expired (its time was up)",
    "idle": "was reclaimed: its slice sat idle on the GPU",
    "released": "was released by an administrator",
    "vanished": "lost its slice (the slice vanished from the host)",
    "layout": "ended for a change of its GPU's MIG layout",
    "drained": "ended when its host was drained",
}


def ended_sentence(session_id: str, host: str, s: Session | None) -> str:
    """Why her server stopped, for the hub's page and log: the session's end, as the host recorded it."""
    if s is None or s.end_reason is None:
        return f"session {session_id} on {host} has ended (the host no longer lists it as yours)"
    when = f" at {s.ended_at:%H:%M} UTC" if s.ended_at is not None else ""
    return f"session {session_id} on {host} {ENDED.get(s.end_reason, 'ended')}{when}"


def hub_env(env: dict[str, str]) -> dict[str, str]:
    """The variables the host passes to the server: the hub's own (``JUPYTERHUB_*``), none else."""
    return {k: v for k, v in env.items() if HUB_ENV_NAME.match(k)}


class HubCalls:
    """The hub's calls for ``user``, reaching the broker at ``broker_socket`` (or over TCP from
    ``institution``) and the hosts named in ``institution``."""

    def __init__(self, institution: Path, broker_socket: Path | None, munge_socket: Path | None) -> None:
        self.institution_path = institution
        self.broker_socket = broker_socket
        self.munge_socket = munge_socket

    def _institution(self) -> Institution:
        return load_institution(self.institution_path)

    def _broker(self, user: str | None) -> BrokerClient:
        client = BrokerClient.here(self.broker_socket, self.institution_path)
        client.as_user = user
        return client

    def _host(self, name: str) -> RemoteHost:
        h = self._institution().host(name)
        if h is None:
            from calque.errors import InfrastructureError

            raise InfrastructureError(f"host {name} is not in {self.institution_path}")
        return RemoteHost(h.name, h.address, h.port, munge_socket=self.munge_socket, service_user=h.service_user)

    def offers(self, user: str) -> Offers:
        """What the institution offers now (free counts per profile, the next to free), and the user's lab
        with its budget left (the broker's: her groups there, its last budget round)."""
        by: dict[str, Offer] = {}
        for view in self._broker(None).hosts():
            if not view.reachable:
                continue
            for st in view.slices:
                if st.drained is not None or st.unavailable:
                    continue
                name = "mps" if st.slice.kind == "mps" else (st.slice.profile or "?")
                o = by.setdefault(name, Offer(name))
                o.total += 1
                if not st.busy:
                    o.free += 1
                elif st.busy_until is not None and (o.next_free is None or st.busy_until < o.next_free):
                    o.next_free = st.busy_until
        waiting = [e for e in self.queue(user) if e.state == "queued"]
        return Offers(sorted(by.values(), key=lambda o: o.profile), len(waiting), self._broker(user).lab())

    def request(self, user: str, args: AnywhereArgs) -> Grant:
        """Her slice: queued until granted (blocks); the broker keeps her request while this waits."""
        return self._broker(user).anywhere(args)

    def queue(self, user: str) -> list[QueueEntry]:
        return self._broker(user).queue()

    def cancel(self, user: str, request_id: str) -> None:
        self._broker(user).cancel(request_id)

    def start_server(self, user: str, host: str, session_id: str, env: dict[str, str]) -> NotebookStarted:
        answer = self._host(host).call(
            "notebook", {"id": session_id, "env": hub_env(env)}, request_id=new_request_id(), as_user=user
        )
        return NotebookStarted.model_validate(answer)

    def session(self, user: str, host: str, session_id: str) -> Session | None:
        """Her session on ``host``, live or ended (``ended_at``, ``end_reason``: checked in, expired,
        reclaimed, released); None when the host does not know it as hers."""
        found = self._host(host).call("status", {"id": session_id}, request_id=new_request_id(), as_user=user)
        return next((Session.model_validate(s) for s in found if s.get("id") == session_id), None)

    def checkin(self, user: str, host: str, session_id: str) -> None:
        self._host(host).call("checkin", {"id": session_id}, request_id=new_request_id(), as_user=user)
