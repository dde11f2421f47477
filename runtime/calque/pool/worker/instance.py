"""The worker's side of its Auto Scaling instance: scale-in protection while it holds a claim, and a drain.

- While any worker on the instance holds a claim, the instance is protected from scale-in
  (``SetInstanceProtection`` on its own instance id, read from IMDSv2), so the backlog policy never
  picks a busy instance when it scales in; the last worker to let go lifts the protection.
- When the group terminates the instance anyway (a rolling replacement, an unhealthy check, spot
  rebalancing), the termination lifecycle hook (``calque-drain``) holds it in
  ``Terminating:Wait``; IMDS's ``autoscaling/target-lifecycle-state`` then reads ``Terminated``.
  The watcher stops the worker like SIGTERM (claims re-sent, ``@exit`` run), and the last worker on
  the instance to finish completes the lifecycle action (``CONTINUE``) so the instance goes now
  rather than at the hook's timeout.

Several workers share one instance (``workers: N``), so the "any worker holds" and "last worker
out" questions are answered by marker files under one lock (``flock``) in a per-group directory.
Off an Auto Scaling instance (a laptop, the sandbox, a plain EC2 instance) ``NoInstance`` does nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from calque.aws.acquire.budget_hold import HOLD_TAG
from calque.aws.acquire.scaling import TERMINATION_HOOK
from calque.aws.aws_errors import AWS_ERRORS, BotoCoreError, ClientError
from calque.aws.imds import Imds
from calque.processes import pid_alive

log = logging.getLogger("calque.pool.worker.instance")
TERMINATING = "Terminated"  # IMDS target-lifecycle-state of an instance on its way out
HOLD_READ_S = 60.0  # how often a worker reads whether its group is held for the lab's budget
# a failed call is logged, never fatal: protection is an optimisation and the hook times out on its own
_AWS_ERRORS = AWS_ERRORS


class InstanceGuard(Protocol):
    """What a worker asks of the instance it runs on."""

    def register(self, worker_id: str) -> None: ...

    def holding(self, worker_id: str, held: Callable[[], bool]) -> None: ...

    def terminating(self) -> bool: ...

    def leave(self, worker_id: str, *, drained: bool) -> None: ...

    def held(self) -> bool: ...


class NoInstance:
    """Not on an Auto Scaling instance: nothing to protect, nothing to drain."""

    def register(self, worker_id: str) -> None:
        return None

    def holding(self, worker_id: str, held: Callable[[], bool]) -> None:
        return None

    def terminating(self) -> bool:
        return False

    def leave(self, worker_id: str, *, drained: bool) -> None:
        return None

    def held(self) -> bool:
        return False


def _safe(worker_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in worker_id)


def _alive(marker: Path) -> bool:
    try:
        pid = int(marker.read_text() or "0")
    except (OSError, ValueError):
        return False
    return pid > 0 and pid_alive(pid)


class AsgInstance:
    """This instance of group ``group``; ``autoscaling`` a boto3 client, ``imds`` the metadata service."""

    def __init__(self, autoscaling: Any, imds: Imds, instance_id: str, group: str, state_dir: Path) -> None:
        self.asg = autoscaling
        self.imds = imds
        self.instance_id = instance_id
        self.group = group
        self.dir = state_dir
        for sub in ("alive", "held"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._protected: bool | None = None
        self._mine = threading.Lock()
        self._held: tuple[float, bool] = (-HOLD_READ_S, False)  # (when read, held then)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._mine, (self.dir / "lock").open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # across the instance's worker processes
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _mark(self, kind: str, worker_id: str, on: bool) -> bool:
        """Set or clear this worker's marker; whether a live worker's marker of ``kind`` remains.

        A marker holds its process id: one left by a worker that died (kill -9) is removed, so a
        crash neither keeps the instance protected nor stops the last worker out from draining it.
        """
        path = self.dir / kind / _safe(worker_id)
        if on:
            path.write_text(str(os.getpid()))
        else:
            path.unlink(missing_ok=True)
        remaining = False
        for other in (self.dir / kind).iterdir():
            if _alive(other):
                remaining = True
            else:
                other.unlink(missing_ok=True)
        return remaining

    def register(self, worker_id: str) -> None:
        with self._locked():
            self._mark("alive", worker_id, True)

    def holding(self, worker_id: str, held: Callable[[], bool]) -> None:
        """This worker's claims changed: protect the instance while any worker holds one.

        ``held`` is read under the lock, so when two threads race the last call sets the truth.
        """
        with self._locked():
            anyone = self._mark("held", worker_id, held())
            if anyone == self._protected:
                return
            try:
                self.asg.set_instance_protection(
                    InstanceIds=[self.instance_id], AutoScalingGroupName=self.group, ProtectedFromScaleIn=anyone
                )
                self._protected = anyone
            except _AWS_ERRORS as exc:
                # an unprotected instance is only at risk of a scale-in, which the drain hook covers
                log.warning("cannot set scale-in protection %s on %s: %s", anyone, self.instance_id, exc)

    def terminating(self) -> bool:
        return self.imds.get("autoscaling/target-lifecycle-state") == TERMINATING

    def held(self) -> bool:
        """Whether the broker holds this group for the lab's budget this month (read once a minute): a held
        instance takes no new claim, so its protection lifts and the hold's next round can end it."""
        read_at, was = self._held
        if time.monotonic() - read_at < HOLD_READ_S:
            return was
        try:
            found = self.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[self.group])["AutoScalingGroups"]
        except _AWS_ERRORS as exc:  # unknown: serve on (the hold still lowers the group's capacity)
            log.warning("cannot read the budget hold of %s: %s", self.group, exc)
            return was
        tags = {str(t["Key"]): str(t["Value"]) for g in found for t in g.get("Tags", [])}
        held = tags.get(HOLD_TAG, "").split(" ")[0] == time.strftime("%Y-%m", time.gmtime())
        if held != was:
            log.warning("group %s %s for the lab's budget", self.group, "held: no new claims" if held else "released")
        self._held = (time.monotonic(), held)
        return held

    def leave(self, worker_id: str, *, drained: bool) -> None:
        """This worker has stopped; the last one out lifts protection and, when draining, completes the hook."""
        self.holding(worker_id, lambda: False)
        with self._locked():
            if self._mark("alive", worker_id, False) or not drained:
                return
            log.info("completing lifecycle action %s for %s (CONTINUE)", TERMINATION_HOOK, self.instance_id)
            try:
                self.asg.complete_lifecycle_action(
                    LifecycleHookName=TERMINATION_HOOK,
                    AutoScalingGroupName=self.group,
                    InstanceId=self.instance_id,
                    LifecycleActionResult="CONTINUE",
                )
            except _AWS_ERRORS as exc:
                log.warning("cannot complete lifecycle action %s: %s (it times out instead)", TERMINATION_HOOK, exc)


def discover(imds: Imds, autoscaling: Callable[[], Any], state_root: Path | None = None) -> InstanceGuard:
    """This instance's guard: ``AsgInstance`` when IMDS names an instance that is in a group, else ``NoInstance``."""
    try:
        instance_id = imds.get("instance-id")
    except (OSError, urllib.error.URLError) as exc:
        log.info("no instance metadata (%s): not on an Auto Scaling instance", exc)
        return NoInstance()
    if not instance_id:
        return NoInstance()
    try:
        found = autoscaling().describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
    except (ClientError, BotoCoreError) as exc:
        log.warning("cannot ask Auto Scaling about %s (%s): no scale-in protection", instance_id, exc)
        return NoInstance()
    if not found:
        return NoInstance()
    group = str(found[0]["AutoScalingGroupName"])
    root = state_root or Path(os.environ.get("CALQUE_STATE_DIR") or tempfile.gettempdir()) / "calque-instance"
    log.info("instance %s of Auto Scaling group %s: protecting it while claims are held", instance_id, group)
    return AsgInstance(autoscaling(), imds, instance_id, group, root / _safe(group))


class LifecycleWatcher:
    """Polls the target lifecycle state every ``interval_s``; calls ``on_terminating()`` once."""

    def __init__(self, guard: InstanceGuard, interval_s: float, on_terminating: Callable[[], None]) -> None:
        self.guard = guard
        self.interval_s = interval_s
        self.on_terminating = on_terminating
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="calque-lifecycle", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.guard.terminating():
                    log.warning("Auto Scaling is terminating this instance: draining")
                    self.on_terminating()
                    return
            except (OSError, urllib.error.URLError) as exc:
                log.info("cannot read the lifecycle state (%s); will keep trying", exc)
            self._stop.wait(self.interval_s)
