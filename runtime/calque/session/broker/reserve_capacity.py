"""Elastic capacity ahead of a reservation (issue 38, part 3): the broker's fleet thread raises a
class's desired capacity far enough ahead of an occurrence that its hosts are in service (booted,
slices laid out, registered) by the start, and gives the raise back once no occurrence needs it.

A class takes part when ``broker.yaml`` says how many slices of a profile one of its hosts holds
(``fleet.classes.<name>.per_host``). Hosts wanted = for each such profile, the slices reserved by the
occurrences under way or starting within the lead, less the slices of that profile on hosts of no
class, divided by ``per_host`` (rounded up; the class's ``MaxSize`` caps it, and a shortfall is
logged). The lead is ``reservation_lead``: twice the class's ``boot_s`` (its measured boot) plus one
``publish_every`` (the thread looks once a period). The desired capacity is only ever raised to the
hosts wanted, never lowered below what demand made it; after the occurrences it is set back to what
it was before the raise, and the class's own scale-in (idle hosts, protected while in use) does the
rest. The raise is kept in memory: after a broker restart the class's scale-in alone brings it down.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from calque.models.fleet import DemandClass, DemandSettings, fleet_pool
from calque.models.pool_names import pool_names
from calque.models.reservation import Reservation
from calque.session.broker.hosts import HostCache

log = logging.getLogger("calque.broker")


def reservation_lead(cls: DemandClass, publish_every: float) -> float:
    """How long before an occurrence its class's hosts are asked for: a slow boot and one missed look."""
    return 2 * cls.boot_s + publish_every


class ReservedCapacity:
    def __init__(
        self,
        settings: DemandSettings,
        cache: HostCache,
        reservations: Callable[[], list[Reservation]],
        members: Callable[[], dict[str, str]],
        asg: Callable[[], Any],
    ) -> None:
        self.settings, self.cache, self.reservations, self.members, self.asg = (
            settings, cache, reservations, members, asg,
        )  # fmt: skip
        self.raised: dict[str, int] = {}  # class -> its desired capacity before the broker raised it

    def wanted(self, cls: DemandClass, now: float) -> int:
        """Hosts of ``cls`` the occurrences under way or within its lead need beyond the fixed hosts."""
        at = datetime.fromtimestamp(now, timezone.utc)
        ahead = at + timedelta(seconds=reservation_lead(cls, self.settings.publish_every))
        reserved: dict[str, int] = {}
        for res in self.reservations():
            if res.profile in cls.per_host and any(b <= ahead for b, _ in res.occurrences(at)[:1]):
                reserved[res.profile] = reserved.get(res.profile, 0) + res.count
        classed = self.members()
        hosts = 0
        for profile, count in reserved.items():
            fixed = sum(
                1
                for v in self.cache.views()
                if v.name not in classed
                for s in v.slices
                if s.slice.kind == "mig" and s.slice.profile == profile
            )
            hosts += math.ceil(max(0, count - fixed) / cls.per_host[profile])
        return hosts

    def apply(self, now: float) -> dict[str, int]:
        """Raise or give back each taking-part class's desired capacity; returns the hosts wanted."""
        out: dict[str, int] = {}
        for name, cls in sorted(self.settings.classes.items()):
            if not cls.per_host:
                continue
            want = out[name] = self.wanted(cls, now)
            group = pool_names(fleet_pool(name)).group
            found = self.asg().describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
            if not found:
                log.warning("class %s: no Auto Scaling group %s to raise for reservations", name, group)
                continue
            desired, top = int(found[0]["DesiredCapacity"]), int(found[0]["MaxSize"])
            if want > top:
                log.warning("class %s: reservations want %d hosts, its group holds at most %d", name, want, top)
            target = min(want, top)
            if want > 0 and target > desired:
                self.raised.setdefault(name, desired)
                self._set(group, target, f"class {name}: raised from {desired} to {target} hosts for reservations")
            elif want == 0 and name in self.raised:
                before = self.raised.pop(name)
                if desired > before:
                    self._set(group, before, f"class {name}: back to {before} hosts after its reservations")
        return out

    def _set(self, group: str, hosts: int, why: str) -> None:
        self.asg().set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=hosts, HonorCooldown=False)
        log.info(why)
