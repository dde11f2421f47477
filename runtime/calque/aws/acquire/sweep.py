"""The capacity sweep: launch N instances over (market, type, subnet) candidates in preference order.

Each round takes the most preferred (market, type) that still has live candidates and spreads what is
still needed over its subnets, one RunInstances call per subnet (MinCount=1, MaxCount=share), in
parallel. EC2 fills such a call as far as capacity goes; what a call did not launch goes to the
next round. A candidate that answers with a capacity error is out; a vCPU-limit error takes out
every candidate under the same quota; any other error stops the sweep. Every round launches at
least one instance or removes at least one candidate, so the sweep ends after at most
``need + len(candidates)`` rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from calque.aws.acquire.quota import quota_class
from calque.aws.aws_errors import error_code, kind
from calque.models.acquire import LaunchAttempt, Lifecycle


@dataclass(frozen=True)
class Candidate:
    market: Lifecycle
    instance_type: str
    subnet_id: str | None


@dataclass
class SweepOutcome:
    instances: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[LaunchAttempt] = field(default_factory=list)
    fatal: ClientError | None = None

    @property
    def launched(self) -> int:
        return len(self.instances)


Launch = Callable[[Candidate, int], list[dict[str, Any]]]


def candidates(markets: Sequence[Lifecycle], types: Sequence[str], subnets: Sequence[str]) -> list[Candidate]:
    """Every (market, type, subnet) in preference order: market first, then type, then subnet."""
    subs: list[str | None] = list(subnets) or [None]
    return [Candidate(m, t, s) for m in markets for t in types for s in subs]


def split(n: int, ways: int) -> list[int]:
    """``n`` spread as evenly as possible over ``ways`` parts, the larger parts first."""
    base, extra = divmod(n, ways)
    return [base + (1 if i < extra else 0) for i in range(ways)]


def sweep(
    launch: Launch,
    cands: Sequence[Candidate],
    need: int,
    *,
    max_parallel: int = 8,
    progress: Callable[[str], None] | None = None,
) -> SweepOutcome:
    """Launch ``need`` instances through ``launch`` over ``cands``; stop early on a non-capacity error."""
    out = SweepOutcome()
    live = list(cands)
    say = progress or (lambda _msg: None)
    with ThreadPoolExecutor(max_workers=max(1, max_parallel)) as pool:
        while need - out.launched > 0 and live and out.fatal is None:
            head = live[0]
            tier = [c for c in live if (c.market, c.instance_type) == (head.market, head.instance_type)]
            shares = [s for s in split(need - out.launched, len(tier)) if s > 0]
            tier = tier[: len(shares)]
            say(f"launching {sum(shares)} x {head.instance_type} ({head.market}) over {len(tier)} subnet(s)")
            futures = [pool.submit(_attempt, launch, c, s) for c, s in zip(tier, shares, strict=True)]
            for cand, share, fut in zip(tier, shares, futures, strict=True):
                got, exc = fut.result()
                out.instances.extend(got)
                attempt = LaunchAttempt(
                    instance_type=cand.instance_type,
                    subnet_id=cand.subnet_id,
                    market=cand.market,
                    requested=share,
                    launched=len(got),
                )
                out.attempts.append(attempt)
                if exc is None:
                    continue  # a partial fill stays live: the next call there says whether any is left
                attempt.error_code, attempt.error = error_code(exc), str(exc)
                if kind(exc) == "capacity":
                    say(f"{cand.instance_type} in {cand.subnet_id or 'default subnet'}: {attempt.error_code}")
                    _drop(live, cand)
                elif kind(exc) == "quota":
                    say(f"{cand.instance_type} ({cand.market}): {attempt.error_code}; skipping its quota class")
                    cls = quota_class(cand.instance_type)
                    live = [
                        c
                        for c in live
                        if not (c.market == cand.market and quota_class(c.instance_type) == cls)
                        or (cls is None and c.instance_type != cand.instance_type)
                    ]
                else:
                    out.fatal = out.fatal or exc
    return out


def _attempt(launch: Launch, cand: Candidate, count: int) -> tuple[list[dict[str, Any]], ClientError | None]:
    try:
        return launch(cand, count), None
    except ClientError as exc:
        return [], exc


def _drop(live: list[Candidate], cand: Candidate) -> None:
    if cand in live:  # a quota error earlier in the same round may have dropped it already
        live.remove(cand)
