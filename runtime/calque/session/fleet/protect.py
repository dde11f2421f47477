"""An elastic session host protecting its live sessions from scale-in, and its way out of the group.

``calque session fleet protect`` (``calque-session-fleet.service`` on the host, beside the session
daemon, never inside it) asks the host's own daemon every ``every`` seconds how many sessions are
live (root's ``list``) and keeps the instance's ``ProtectedFromScaleIn`` equal to "any live": the
class's idle-host policy can then only end a host nobody is using. It calls ``SetInstanceProtection``
only when the answer changes, so a checkout never waits on AWS, and a failed call is retried on the
next period (the daemon and its sessions carry on regardless).

When the group ends the instance anyway (teardown, a refresh, spot), the ``calque-drain`` lifecycle
hook holds it in ``Terminating:Wait`` and IMDS's ``autoscaling/target-lifecycle-state`` reads
``Terminated``: the helper runs the drain step (``calque session drain --reason ...``: no new
checkouts here, live sessions run to their deadline), deregisters from the broker, waits while
sessions are live (bounded by the hook's timeout), and completes the lifecycle action (CONTINUE).
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from calque.aws.acquire.scaling import TERMINATION_HOOK
from calque.aws.errors import aws_errors

log = logging.getLogger("calque.session.fleet")
TERMINATING = "Terminated"
DRAIN_STEP = ("calque", "session", "drain", "--reason", "this host is leaving its Auto Scaling group")
LiveCount = Callable[[], int]


def live_sessions_of_daemon(socket_path: str | None = None) -> int:
    """The host daemon's live sessions (root's ``list`` names every session id)."""
    from pathlib import Path

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


def run_drain_step(command: tuple[str, ...] = DRAIN_STEP, timeout_s: float = 60.0) -> bool:
    """The drain before the host leaves; False (logged) when it fails or the command is not there yet."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("drain step %s failed: %s; live sessions still run to their deadline", " ".join(command), exc)
        return False
    if done.returncode != 0:
        log.warning("drain step %s exited %d: %s", " ".join(command), done.returncode, done.stderr.strip()[-400:])
    return done.returncode == 0


def leave(
    host: FleetHost,
    live: LiveCount,
    *,
    drain: Callable[[], bool],
    deregister: Callable[[], object],
    hold_s: float,
    every: float = 15.0,
) -> int:
    """Drain, deregister, wait while sessions are live (at most ``hold_s``), complete the action.

    Returns the sessions still live when it completed (0 unless ``hold_s`` ran out)."""
    drain()
    try:
        deregister()
    except Exception as exc:  # the broker finds the host unreachable soon enough
        log.warning("could not deregister %s: %s", host.instance_id, exc)
    deadline = time.monotonic() + hold_s
    left = live()
    while left and time.monotonic() < deadline:
        time.sleep(min(every, max(0.0, deadline - time.monotonic())))
        left = live()
    host.complete()
    return left


def watch(
    host: FleetHost,
    live: LiveCount,
    terminating: Callable[[], bool],
    on_leave: Callable[[], int],
    *,
    every: float,
    rounds: int | None = None,
) -> None:
    """Every ``every`` seconds: protection to match the live sessions, until the group ends the instance."""
    n = 0
    while rounds is None or n < rounds:
        n += 1
        try:
            leaving = terminating()
            if not leaving:
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
            time.sleep(every)
