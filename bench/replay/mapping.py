"""A trace task -> an institution's request: every choice here is printed at the top of the output.

- arrival: the task's creation time, minus the window's start, divided by the compression factor;
- hold: its run time (deletion - scheduled), divided by the same factor; a session still held when the
  window (compressed) ends is checked in then, so the replay ends when the window does;
- size: the smallest MIG profile of an A100-40GB covering its GPU share (``gpu_milli``), then the
  smallest profile the institution's layout offers that covers that (a 2g.10gb ask on a layout of
  3g/4g/7g slices gets a 3g.20gb slice: the waste is the layout's, and counted);
- set aside and counted, not replayed: tasks with no GPU, whole-GPU tasks (``num_gpu`` > 1 or
  ``gpu_milli`` 1000: the pool's demand, issue 37 part 3), tasks never scheduled (Pending: no run time),
  and tasks created outside the window;
- lab: by the task's QoS class (``LAB_OF_QOS``): the trace names no owners, and QoS is the one column
  that splits the tasks into groups of different size and habit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .holders import booked_s
from .trace import Task

DAY = 86400.0
# A100-40GB MIG profiles: (name, compute sevenths of the card).
PROFILES: tuple[tuple[str, int], ...] = (("1g.5gb", 1), ("2g.10gb", 2), ("3g.20gb", 3), ("4g.20gb", 4), ("7g.40gb", 7))
SEVENTHS = dict(PROFILES)
ALL_PROFILES = tuple(name for name, _ in PROFILES)
LAB_OF_QOS = {"LS": "ls", "BE": "be", "Burstable": "be"}  # no fractional task is Burstable


@dataclass(frozen=True)
class Window:
    start_day: float
    days: float
    compression: float  # trace seconds per replay second

    @property
    def start(self) -> float:
        return self.start_day * DAY

    @property
    def end(self) -> float:
        return (self.start_day + self.days) * DAY

    @property
    def replay_s(self) -> float:
        return self.days * DAY / self.compression


@dataclass(frozen=True)
class Request:
    task: str
    lab: str
    asked: str  # the smallest profile covering the share
    profile: str  # the smallest offered profile covering ``asked``
    arrival: float  # replay seconds after the window's start
    hold: float  # replay seconds: the task's run time, busy
    booked: float = 0.0  # replay seconds the holder keeps the session unless it is ended first (holders.py)


@dataclass
class Demand:
    requests: list[Request] = field(default_factory=list)
    set_aside: Counter[str] = field(default_factory=Counter)


def covering(milli: int, offered: tuple[str, ...] = ALL_PROFILES) -> str | None:
    """The smallest of ``offered`` whose compute share covers ``milli`` thousandths of a GPU (None: none does)."""
    fits = [p for p in offered if SEVENTHS[p] * 1000 >= milli * 7]
    return min(fits, key=lambda p: SEVENTHS[p]) if fits else None


def to_request(task: Task, window: Window, offered: tuple[str, ...], holders: str = "prompt") -> Request | str:
    """The task's request, or why it is set aside (a counter's key)."""
    if task.num_gpu == 0:
        return "no GPU"
    if task.num_gpu > 1 or task.gpu_milli >= 1000:
        return "whole GPU(s): the pool's (part 3)"
    if not window.start <= task.created < window.end:
        return "outside the window"
    if task.scheduled is None or task.deleted is None or task.deleted < task.scheduled:
        return "never scheduled (no run time)"
    lab = LAB_OF_QOS.get(task.qos)
    if lab is None:
        return f"unknown QoS {task.qos!r}"
    asked = covering(task.gpu_milli)
    served = covering(SEVENTHS[asked] * 1000 // 7, offered) if asked else None
    if asked is None or served is None:
        return "larger than any offered slice"
    return Request(
        task=task.name,
        lab=lab,
        asked=asked,
        profile=served,
        arrival=(task.created - window.start) / window.compression,
        hold=(task.deleted - task.scheduled) / window.compression,
        booked=booked_s(task.deleted - task.scheduled, holders) / window.compression,
    )


def demand(tasks: list[Task], window: Window, offered: tuple[str, ...], holders: str = "prompt") -> Demand:
    d = Demand()
    for t in tasks:
        got = to_request(t, window, offered, holders)
        if isinstance(got, Request):
            d.requests.append(got)
        else:
            d.set_aside[got] += 1
    d.requests.sort(key=lambda r: r.arrival)
    return d


def choices(window: Window, offered: tuple[str, ...]) -> list[str]:
    """The mapping's choices, one line each, for the top of the output."""
    return [
        f"window: trace days {window.start_day:g} to {window.start_day + window.days:g} "
        f"({window.days:g} of 149), compressed {window.compression:g}x: {window.replay_s:.0f} s of replay",
        "arrival = creation_time; hold = deletion_time - scheduled_time (both / compression); "
        "a session still held at the window's end is checked in then",
        "size = smallest A100-40GB MIG profile covering gpu_milli ("
        + ", ".join(f"{p} <= {s * 1000 // 7}" for p, s in PROFILES)
        + "), served by the smallest offered profile covering it (offered: "
        + ", ".join(offered)
        + ")",
        "set aside (counted, not replayed): no GPU; whole GPU(s) (the pool's demand, part 3); never scheduled; "
        "outside the window",
        "lab = the task's QoS class: " + ", ".join(f"{q} -> {lab}" for q, lab in LAB_OF_QOS.items()),
    ]
