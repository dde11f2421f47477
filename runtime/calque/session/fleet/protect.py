"""An elastic session host protecting its live sessions from scale-in, and its way out of the group.

``calque session fleet protect`` (``calque-session-fleet.service`` on the host, beside the session
daemon, never inside it) asks the host's own daemon every ``every`` seconds how many sessions are
live (root's ``list``) and keeps the instance's ``ProtectedFromScaleIn`` equal to "any live": the
class's idle-host policy can then only end a host nobody is using. It calls ``SetInstanceProtection``
only when the answer changes, so a checkout never waits on AWS, and a failed call is retried on the
next period (the daemon and its sessions carry on regardless).

When the group ends the instance anyway (teardown, a refresh, spot), the ``calque-drain`` lifecycle
hook holds it in ``Terminating:Wait`` and IMDS's ``autoscaling/target-lifecycle-state`` reads
``Terminated``: the helper drains the whole host (``calque session drain --by W --reason ...`` as
root with no HOST: the local daemon, every GPU), so checkouts here are refused naming the drain and
each live session gets the end notice and ends (reason ``drained``) by ``W`` rather than being cut
off with the instance; it deregisters from the broker, waits while sessions are live, and completes
the lifecycle action (CONTINUE) within the hold. ``W`` is the hold (``--hold``, the hook's heartbeat
timeout) less one look period (the action may have opened that long before the helper saw it) and
less the time a session's end takes (SIGTERM, the grace, the cleanup): see ``drain_window``. A drain
step that fails is logged; the hook is completed within its bound all the same.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calque.aws.acquire.scaling import TERMINATION_HOOK
from calque.aws.aws_errors import aws_errors
from calque.errors import UsageError
from calque.session.fleet.register import deregister
from calque.session.scalein import ScaleInGuard

if TYPE_CHECKING:
    from calque.session.fleet.this_host import ThisHost

log = logging.getLogger("calque.session.fleet")
TERMINATING = "Terminated"
DRAIN_REASON = "this host is leaving its Auto Scaling group"
# What a session's end takes after its deadline (the timers' SIGTERM, kill grace, cleanup), kept back
# from the hold so the last session has ended before the action is completed; at most half the hold.
END_MARGIN_S = 60.0
LiveCount = Callable[[], int]
ANSWER_EVERY_S = 0.05  # how soon a checkout's ask for protection is seen


def drain_window(hold_s: float, every: float) -> tuple[float, float]:
    """(the drain's ``--by``, the wait before completing): both within ``hold_s`` less one look."""
    wait = max(hold_s - every, 1.0)
    return max(wait - min(END_MARGIN_S, wait / 2), 1.0), wait


def drain_step(by_s: float, socket_path: str | None = None) -> tuple[str, ...]:
    """``calque session drain`` of this very install (the script beside its interpreter; ``calque``
    on PATH otherwise), with no HOST: the local daemon drains the whole host."""
    script = Path(sys.executable).parent / "calque"
    sock = ("--socket", socket_path) if socket_path else ()
    exe = str(script) if script.exists() else "calque"
    return (exe, "session", "drain", "--by", f"{int(by_s)}s", "--reason", DRAIN_REASON, *sock)


def live_sessions_of_daemon(socket_path: str | None = None) -> int:
    """The host daemon's live sessions (root's ``list`` names every session id)."""
    from calque.session.client.connection import SessionClient

    client = SessionClient(Path(socket_path)) if socket_path else SessionClient()
    return sum(1 for s in client.list_slices() if s.session_id)


def find_group(asg: Any, instance_id: str) -> tuple[str, bool] | None:
    """The instance's Auto Scaling group and whether it is protected now; None off a group."""
    with aws_errors(f"find the Auto Scaling group of {instance_id}"):
        found = asg.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
    if not found:
        return None
    return str(found[0]["AutoScalingGroupName"]), bool(found[0].get("ProtectedFromScaleIn"))


@dataclass
class FleetHost:
    """One instance of a class: its id, group and the protection it last set."""

    asg: Any
    instance_id: str
    group: str
    protected: bool | None = None  # as last set or read; None: unknown

    def sync(self, live: int) -> bool | None:
        """Protection to match ``live``; returns the protection set now, or None when unchanged."""
        want = live > 0
        if want == self.protected:
            return None
        with aws_errors(f"{'set' if want else 'lift'} scale-in protection of {self.instance_id}"):
            self.asg.set_instance_protection(
                InstanceIds=[self.instance_id], AutoScalingGroupName=self.group, ProtectedFromScaleIn=want
            )
        self.protected = want
        log.info(
            "%s scale-in protection of %s (%d live session(s))", "set" if want else "lifted", self.instance_id, live
        )
        return want

    def complete(self) -> None:
        with aws_errors(f"complete the {TERMINATION_HOOK} lifecycle action of {self.instance_id}"):
            self.asg.complete_lifecycle_action(
                AutoScalingGroupName=self.group,
                LifecycleHookName=TERMINATION_HOOK,
                InstanceId=self.instance_id,
                LifecycleActionResult="CONTINUE",
            )


def run_drain_step(command: tuple[str, ...], timeout_s: float = 60.0) -> bool:
    """The drain before the host leaves; False (logged) when it fails or the command is not there yet."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning(
            "drain step %s failed: %s; the hook is completed within its hold all the same", " ".join(command), exc
        )
        return False
    if done.returncode != 0:
        log.warning("drain step %s exited %d: %s", " ".join(command), done.returncode, done.stderr.strip()[-400:])
    else:
        log.info("drained for leaving: %s", done.stdout.strip()[-400:])
    return done.returncode == 0


def leave(
    host: FleetHost,
    live: LiveCount,
    *,
    drain: Callable[[float], bool],
    deregister: Callable[[], object],
    hold_s: float,
    every: float = 15.0,
) -> int:
    """Drain (sessions end by ``drain_window``'s ``--by``), deregister, wait while sessions are live
    (bounded within ``hold_s``), complete the action.

    Returns the sessions still live when it completed (0 unless the drain failed or a session
    outlived its end; -1 when the daemon did not answer to the last)."""
    began = time.monotonic()
    by_s, wait_s = drain_window(hold_s, every)
    try:
        drain(by_s)
    except Exception as exc:  # the hook is still completed within its hold
        log.warning("drain step for %s failed: %s", host.instance_id, exc)
    try:
        deregister()
    except Exception as exc:  # the broker finds the host unreachable soon enough
        log.warning("could not deregister %s: %s", host.instance_id, exc)
    deadline = began + wait_s
    left = _live_or_unknown(live)
    while left and time.monotonic() < deadline:
        time.sleep(min(every, max(0.0, deadline - time.monotonic())))
        left = _live_or_unknown(live)
    host.complete()
    return left


def _live_or_unknown(live: LiveCount) -> int:
    """The live count; a daemon that does not answer might still hold sessions: -1, wait on (bounded)."""
    try:
        return live()
    except Exception as exc:
        log.warning("fleet helper: cannot count the live sessions: %s", exc)
        return -1


@dataclass
class Guarded:
    """The helper's side of ``session/scalein.py``: protection before the daemon's first grant."""

    guard: ScaleInGuard
    handled: float = 0.0  # the last ``wanted`` mark acted on

    def protect_if_wanted(self, host: FleetHost) -> bool:
        """A checkout waits for protection: set it (AWS first, then the word to the daemon)."""
        wanted = self.guard.marked_at("wanted")
        if wanted <= self.handled:
            return False
        host.sync(1)
        self.guard.set_protected(True)
        self.handled = wanted
        return True

    def look(self, host: FleetHost, live: LiveCount) -> None:
        """Protection to match the live sessions; lifted only when nothing was granted or wanted since
        the count began (checked under the daemon's lock, the AWS call after it)."""
        began = time.time()
        n = live()
        if self.protect_if_wanted(host) or n > 0:
            host.sync(1)
            self.guard.set_protected(True)
            return
        with self.guard.locked():
            if self.guard.marked_at("granted") >= began or self.guard.marked_at("wanted") > self.handled:
                return  # a grant (or an ask) raced the count: the next look counts it
            self.guard.set_protected(False)
        host.sync(0)


def watch(
    host: FleetHost,
    live: LiveCount,
    terminating: Callable[[], bool],
    on_leave: Callable[[], int],
    *,
    every: float,
    rounds: int | None = None,
    guarded: Guarded | None = None,
) -> None:
    """Every ``every`` seconds: protection to match the live sessions, until the group ends the instance;
    with ``guarded``, a checkout's ask for protection is answered within ``ANSWER_EVERY_S`` between looks."""
    n = 0
    while rounds is None or n < rounds:
        n += 1
        try:
            leaving = terminating()
            if not leaving and guarded is not None:
                guarded.look(host, live)
            elif not leaving:
                host.sync(live())
        except Exception as exc:  # the daemon restarting, IMDS or AWS slow: the next period asks again
            log.warning("fleet helper: %s (next try in %gs)", exc, every)
            leaving = False
        if leaving:
            try:
                on_leave()
            except Exception as exc:  # the hook's own timeout CONTINUEs the termination anyway
                log.warning("fleet helper: leaving the group: %s; the hook's timeout ends it", exc)
            return
        if rounds is None or n < rounds:
            _between(host, guarded, every)


def _between(host: FleetHost, guarded: Guarded | None, every: float) -> None:
    """The wait between looks, answering a checkout's ask for protection at once."""
    until = time.monotonic() + every
    while (left := until - time.monotonic()) > 0:
        time.sleep(min(left, ANSWER_EVERY_S))
        if guarded is None:
            continue
        try:
            guarded.protect_if_wanted(host)
        except Exception as exc:  # AWS slow or refusing: the checkout waits, the next try is soon
            log.warning("fleet helper: protecting for a checkout: %s", exc)


def serve(
    here: ThisHost,
    fleet_class: str,
    *,
    every: float,
    hold: float,
    once: bool = False,
    socket_path: str | None = None,
    guard: Path | None = None,
) -> FleetHost:
    """``calque session fleet protect``: this instance's protection kept to its daemon's live sessions
    (with ``guard``, a checkout's ask answered between looks) until the group ends it, then the way out
    (drain, deregister, the hook completed); one look with ``once``. The host as last seen."""
    meta = here.metadata
    iid = here.instance_id
    asg = here.client("autoscaling")
    found = find_group(asg, iid)
    if found is None:
        raise UsageError(f"{iid} is in no Auto Scaling group: nothing to protect")
    host = FleetHost(asg, iid, found[0], found[1])

    def live() -> int:
        return live_sessions_of_daemon(socket_path)

    def terminating() -> bool:
        return bool(meta.get("autoscaling/target-lifecycle-state") == TERMINATING)

    def on_leave() -> int:
        ssm = here.client("ssm")

        def drain(by_s: float) -> bool:
            # the call itself is quick; bounded by the wait so a hung one still leaves the hook in time
            return run_drain_step(drain_step(by_s, socket_path), timeout_s=min(60.0, drain_window(hold, every)[1]))

        return leave(
            host, live, drain=drain, deregister=lambda: deregister(ssm, fleet_class, iid), hold_s=hold, every=every
        )

    guarded = None
    if guard is not None:
        g = ScaleInGuard(guard)
        g.prepare()
        # Asks older than this helper were answered by the one before it; a checkout waiting now asks
        # again every few milliseconds.
        guarded = Guarded(g, handled=g.marked_at("wanted"))
        g.set_protected(bool(host.protected))  # the group's word at the start, before the first look
    watch(host, live, terminating, on_leave, every=every, rounds=1 if once else None, guarded=guarded)
    return host
