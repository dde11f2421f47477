"""``CalqueSpawner``: JupyterHub's spawner for notebooks on slices (issue 36).

``start()`` asks the institution's broker for a slice *for the hub's user* (the hub is a trusted
caller named in ``institution.yaml``), waits in the fair queue with the place and estimate as the
hub's progress events, then has the slice's host start ``jupyterhub-singleuser`` as the user inside
the session's cgroup (``notebook``: the host's fixed command); it returns where the server listens.
``poll()`` follows the session: when it has ended (check-in, expiry, idle reclaim, release) the server
is gone with it, and the hub's log and her next options form say how it ended (the host's record).
``stop()`` checks the session in. The session id, host and request id are the spawner's state, so a
restarted hub finds running servers again.

Config (``c.CalqueSpawner.*``): ``institution``, ``broker_socket``, ``munge_socket``, ``default_ttl``,
``max_ttl``, ``group_presets``; ``start_timeout`` defaults to an hour (a queue's wait counts).
"""

from __future__ import annotations

import asyncio
import html
import math
import os
import socket
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from jupyterhub.spawner import Spawner
from traitlets import Dict, Float, Unicode, default

from calque.durations import parse_duration
from calque.errors import CalqueError, UsageError
from calque.jupyterhub.slices import HubCalls, Offers, ended_sentence
from calque.models.broker import AnywhereArgs, LabStanding
from calque.models.session import Session

MPS = "mps"
EXTEND = "`calque session extend --by 1h` in a notebook terminal gives it more time"


def choice_from_form(formdata: dict[str, list[str]], default_ttl: str, max_ttl: str) -> dict[str, Any]:
    """The user's choice from the form: a profile (or ``mps``) and a TTL within ``max_ttl``; a
    ValueError (shown on the form by the hub) for anything else."""
    profile = (formdata.get("profile") or [""])[0].strip()
    ttl = (formdata.get("ttl") or [default_ttl])[0].strip() or default_ttl
    seconds = parse_duration(ttl, what="ttl")
    if seconds <= 0:
        raise ValueError("the session's length must be positive")
    if seconds > parse_duration(max_ttl, what="max_ttl"):
        raise ValueError(f"a notebook session may last at most {max_ttl}")
    return {"profile": profile or None, "ttl": ttl}


def form_html(
    offers: Offers, preset: dict[str, str], default_ttl: str, max_ttl: str, last_end: str | None = None
) -> str:
    """The options form: why her last server stopped (when its session ended without her), each profile
    with its free count and when the next frees, the user's lab and its budget left this month."""
    return (_ended_html(last_end) if last_end else "") + _choices_html(offers, preset, default_ttl, max_ttl)


def _ended_html(last_end: str) -> str:
    return f'<p class="alert alert-warning" id="calque-last-end">Your last server stopped: {html.escape(last_end)}.</p>'


def _choices_html(offers: Offers, preset: dict[str, str], default_ttl: str, max_ttl: str) -> str:
    chosen = preset.get("profile")
    if offers.unknown is not None:
        return (
            f"<p>What is free cannot be shown now ({html.escape(offers.unknown)}).</p>"
            f'<label for="profile">GPU slice (a MIG profile such as 1g.24gb, or mps)</label>'
            f'<input class="form-control" name="profile" id="profile" value="{html.escape(chosen or "")}">'
            f'<label for="ttl">For how long (at most {html.escape(max_ttl)})</label>'
            f'<input class="form-control" name="ttl" id="ttl" value="{html.escape(preset.get("ttl", default_ttl))}">'
        )
    rows = []
    for o in offers.choices:
        label = "MPS slot (shared GPU, no isolation)" if o.profile == MPS else o.profile
        when = f"; next frees at {o.next_free:%H:%M} UTC" if o.free == 0 and o.next_free is not None else ""
        note = f"{o.free} of {o.total} free{when}" if o.free else f"none free: you will wait in the queue{when}"
        sel = " selected" if o.profile == chosen else ""
        rows.append(f'<option value="{html.escape(o.profile)}"{sel}>{html.escape(label)}: {html.escape(note)}</option>')
    lab = _lab_html(offers.lab) if offers.lab is not None else ""
    waiting = f"<p>You already have {offers.waiting} request(s) waiting.</p>" if offers.waiting else ""
    ttl = html.escape(preset.get("ttl", default_ttl))
    return (
        f'<label for="profile">GPU slice</label><select class="form-control" name="profile" id="profile">'
        f"{''.join(rows)}</select>"
        f'<label for="ttl">For how long (at most {html.escape(max_ttl)})</label>'
        f'<input class="form-control" name="ttl" id="ttl" value="{ttl}">{lab}{waiting}'
        "<p>The server, its kernels and terminals run on that slice alone and stop when the session ends "
        "(its time is up, it sits idle on the GPU, or you stop the server).</p>"
    )


def amount(x: float) -> str:
    """A budget's figure: two decimals, or up to three significant digits below 1 (0.0035 left is not
    nothing), never in exponent notation."""
    if x >= 1 or x <= 0:
        return f"{x:,.2f}"
    return f"{x:.{min(6, 2 - math.floor(math.log10(x)))}f}".rstrip("0").rstrip(".")


def _lab_html(standing: LabStanding) -> str:
    """Her lab and its budget left this month, as the broker's last budget round summed it; what happens
    when it is spent in the words of the refusal; an alert once it is nearly or wholly spent."""
    if standing.lab is None:
        return '<p id="calque-lab">You are in none of the institution\'s labs: no lab budget applies.</p>'
    lab = html.escape(standing.lab)
    s = standing.spend
    if s is None or s.limit is None or standing.left is None:
        return f'<p id="calque-lab">Billed to lab <b>{lab}</b>, which has no budget: its use is not capped.</p>'
    limit = f"{amount(s.limit)}{f' + {amount(s.extra)}' if s.extra else ''} {s.unit}"
    used = f"{s.used:.0%} used" if s.used is not None else ""
    when = f", as of {standing.as_of:%H:%M} UTC" if standing.as_of is not None else ""
    spent = html.escape(standing.when_spent or "")
    if s.state == "over":
        return (
            f'<p class="alert alert-danger" id="calque-lab">Lab <b>{lab}</b> has spent its {html.escape(limit)} '
            f"budget for {html.escape(s.month)} ({html.escape(used + when)}): {spent}.</p>"
        )
    alert = ' class="alert alert-warning"' if s.state == "notice" else ""
    return (
        f'<p{alert} id="calque-lab">Billed to lab <b>{lab}</b>: {html.escape(amount(standing.left))} of its '
        f"{html.escape(limit)} budget left for {html.escape(s.month)} ({html.escape(used + when)}). "
        f"When it is spent, {spent}.</p>"
    )


class CalqueSpawner(Spawner):  # type: ignore[misc]
    institution = Unicode("/etc/calque/institution.yaml", help="institution.yaml: the broker and hosts").tag(
        config=True
    )
    broker_socket = Unicode(
        "/run/calque/broker.sock", help="the broker's unix socket when the hub is on the front-door host"
    ).tag(config=True)
    munge_socket = Unicode("", help="munged's socket (default: munge's own)").tag(config=True)
    default_ttl = Unicode("4h", help="a session's length when the user does not say").tag(config=True)
    max_ttl = Unicode("8h", help="the longest a user may ask for (each host's policy bounds it too)").tag(config=True)
    group_presets = Dict(
        {}, help="Unix group -> preset choices, e.g. {'teaching': {'profile': '1g.24gb', 'ttl': '2h'}}"
    ).tag(config=True)
    queue_poll = Float(2.0, help="seconds between looks at the user's place in the queue").tag(config=True)
    warn_before = Float(900.0, help="seconds before a session's end at which poll() warns in the hub's log").tag(
        config=True
    )

    @default("start_timeout")
    def _start_timeout_default(self) -> int:
        return 3600  # waiting in the queue is part of the start

    @default("options_form")
    def _options_form_default(self) -> Any:
        return _form

    def calls(self) -> HubCalls:
        broker = Path(self.broker_socket) if self.broker_socket else None
        return HubCalls(Path(self.institution), broker, Path(self.munge_socket) if self.munge_socket else None)

    # -- state -----------------------------------------------------------------------------------

    session_id: str | None = None
    host_name: str | None = None
    request_id: str | None = None
    # Why her last server stopped when its session ended without her (expired, reclaimed, released):
    # kept past clear_state, for her next form, until she starts again.
    last_end: str | None = None
    # Why her live session is about to end (expiry or idle reclaim), from the last poll; None otherwise.
    notice: str | None = None

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        for key in ("session_id", "host_name", "request_id", "last_end"):
            if getattr(self, key):
                state[key] = getattr(self, key)
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.session_id = state.get("session_id")
        self.host_name = state.get("host_name")
        self.request_id = state.get("request_id")
        self.last_end = state.get("last_end")

    def clear_state(self) -> None:
        super().clear_state()
        self.session_id = self.host_name = self.request_id = self.notice = None

    # -- the form --------------------------------------------------------------------------------

    def preset(self) -> dict[str, str]:
        import grp
        import pwd

        try:
            pw = pwd.getpwnam(self.user.name)
            groups = {grp.getgrgid(g).gr_name for g in os.getgrouplist(pw.pw_name, pw.pw_gid)}
        except (KeyError, OSError):
            return {}
        for group, choices in self.group_presets.items():
            if group in groups:
                return {str(k): str(v) for k, v in dict(choices).items()}
        return {}

    def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        return choice_from_form(formdata, self.preset().get("ttl", self.default_ttl), self.max_ttl)

    # -- the lifecycle ---------------------------------------------------------------------------

    def _progress(self, percent: int, message: str) -> None:
        self._events.append({"progress": percent, "message": message})
        self.log.info("calque: %s: %s", self.user.name, message)

    async def _thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def start(self) -> tuple[str, int]:
        self._events: list[dict[str, Any]] = []
        self._done = False
        self.last_end = self.notice = None
        try:
            return await self._start()
        finally:
            self._done = True

    async def _start(self) -> tuple[str, int]:
        user = self.user.name
        calls = self.calls()
        opts = {**self.preset(), **{k: v for k, v in (self.user_options or {}).items() if v}}
        profile = opts.get("profile")
        mps = profile == MPS
        args = AnywhereArgs(
            profile=None if mps else profile,
            mps=mps,
            consent=mps,  # chosen on the form, which says what an MPS slot shares
            ttl=opts.get("ttl", self.default_ttl),
            wait=True,
            request_id=self.request_id or "hub-" + os.urandom(12).hex(),
        )
        self.request_id = args.request_id
        self._progress(5, f"asking the institution for a {profile or 'GPU'} slice")
        granting = asyncio.ensure_future(self._thread(calls.request, user, args))
        try:
            while not granting.done():
                await self._place(calls, user)
                await asyncio.wait([granting], timeout=self.queue_poll)
            grant = granting.result()
        except asyncio.CancelledError:
            await self._thread(self._give_up, calls, user)  # the hub gave up: nothing stays queued or held
            raise
        except CalqueError as exc:
            raise RuntimeError(f"no GPU slice for {user}: {exc}") from exc
        self.session_id, self.host_name = grant.session.id, grant.host
        self._progress(60, f"session {grant.ref}: {grant.session.slice_id} until {grant.session.expires_at:%H:%M} UTC")
        try:
            started = await self._thread(calls.start_server, user, grant.host, grant.session.id, self.get_env())
        except CalqueError as exc:
            await self._thread(self._give_up, calls, user)
            raise RuntimeError(f"the notebook server did not start on {grant.host}: {exc}") from exc
        self._progress(80, f"JupyterLab starting on {grant.host} (log: {started.log})")
        return started.ip, started.port

    async def _place(self, calls: HubCalls, user: str) -> None:
        try:
            entries = await self._thread(calls.queue, user)
        except CalqueError:
            return
        mine = next((e for e in entries if e.id == self.request_id), None)
        if mine is not None and mine.state == "queued":
            eta = f", a slice may free by {mine.estimate:%H:%M} UTC" if mine.estimate else ""
            self._progress(10, f"waiting in the institution's queue: place {mine.position}{eta}")

    def _give_up(self, calls: HubCalls, user: str) -> None:
        if self.session_id and self.host_name:
            try:
                calls.checkin(user, self.host_name, self.session_id)
            except CalqueError as exc:
                self.log.warning("calque: could not check in %s for %s: %s", self.session_id, user, exc)
        elif self.request_id:
            try:
                calls.cancel(user, self.request_id)
            except CalqueError as exc:
                self.log.warning("calque: could not cancel request %s for %s: %s", self.request_id, user, exc)
        self.clear_state()

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        sent = 0
        while True:
            events = getattr(self, "_events", [])
            while sent < len(events):
                yield events[sent]
                sent += 1
            if getattr(self, "_done", True):
                return
            await asyncio.sleep(0.5)

    async def poll(self) -> int | None:
        if not self.session_id or not self.host_name:
            return 0
        if getattr(self, "_ended", None) == self.session_id:
            return 0  # the hub polls again as it cleans up: the host was asked once
        try:
            live = await self._thread(self.calls().session, self.user.name, self.host_name, self.session_id)
        except CalqueError as exc:  # the host does not answer: its sessions go on without it
            self.log.warning("calque: cannot ask %s about %s: %s", self.host_name, self.session_id, exc)
            return None
        if live is None or live.ended_at is not None:
            self._ended, self.notice = self.session_id, None
            self.last_end = ended_sentence(self.session_id, self.host_name, live)
            self.log.warning("calque: %s's %s: the notebook server ended with it", self.user.name, self.last_end)
            return 0
        self._warn(live)
        if self.port and not await self._thread(_listening, self.ip or self.host_name, self.port):
            return 1  # the server exited inside a live session (the session stays until checked in)
        return None

    def _warn(self, s: Session) -> None:
        """When her session is about to end: the hub's log says so once per deadline, and ``notice`` says
        it at every poll for the hub's pages (``announce.py``); the host tells her terminals and the
        server's log itself."""
        now = datetime.now(timezone.utc)
        soon = timedelta(seconds=self.warn_before)
        ends = [
            (when, why, remedy)
            for when, why, remedy in (
                (s.expires_at, "its time is up", EXTEND),
                (s.idle_ends_at, "its slice sits idle on the GPU", "work on the GPU keeps it (extend does not)"),
            )
            if when is not None and when - now < soon
        ]
        if not ends:
            self.notice = None
            return
        when, why, remedy = min(ends, key=lambda e: e[0])  # the first end is the one to act on
        self.notice = f"session {s.id} on {self.host_name} ends at {when:%H:%M} UTC ({why}): {remedy}"
        if getattr(self, "_warned", None) != (why, when):
            self._warned = (why, when)
            self.log.warning("calque: %s's %s", self.user.name, self.notice)

    async def stop(self, now: bool = False) -> None:
        if self.session_id and self.host_name:
            try:
                await self._thread(self.calls().checkin, self.user.name, self.host_name, self.session_id)
            except UsageError as exc:  # it had ended already (not_found)
                self.log.info("calque: %s: %s", self.user.name, exc)
        self.session_id = self.host_name = None


async def _form(spawner: CalqueSpawner) -> str:
    """The form, its broker calls on a thread: the hub's event loop serves everyone else meanwhile."""
    preset = spawner.preset()
    try:
        offers = await asyncio.to_thread(spawner.calls().offers, spawner.user.name)
    except CalqueError as exc:  # the broker does not answer: say so, and let her ask anyway
        spawner.log.warning("calque: the options form without the broker's view: %s", exc)
        offers = Offers(unknown=str(exc))
    return form_html(offers, preset, preset.get("ttl", spawner.default_ttl), spawner.max_ttl, spawner.last_end)


def _listening(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=5):
            return True
    except OSError:
        return False
