"""``calque ramp``'s core: one instance, one warm worker, a ramp of item counts, then terminate.

It acquires ONE instance through the ``Acquirer`` (its own cohort ``ramp-<id>``), loads the workload
into ONE ``WarmSupervisor`` (``@enter`` runs once, so only the first rung pays the model load), runs
each rung's items through it in turn, and terminates the instance whatever happens: at the end, on
an error, on Ctrl-C. The worker runs in this process: in the offline tier the instance comes from
the moto server and the workload runs locally.

This module composes Layer 0 (acquire) with the warm runtime; ``calque.aws.acquire`` does not
import it, so the Acquirer stays free of workload code.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from calque.aws.acquire.acquirer import Acquirer
from calque.aws.acquire.gate import Consent
from calque.errors import CalqueError, UsageError
from calque.models import Item, ItemResult
from calque.models.acquire import CohortSpec, Market, RampReport, RampRung, RootVolume

MAX_RUNG = 1_000_000


@dataclass
class RampOptions:
    """What the caller asked for; ``calque ramp``'s flags map onto these one to one."""

    workload: str
    rungs: list[int]
    instance_type: str
    method: str | None = None
    items_file: str | None = None
    spot: bool = False
    ttl_seconds: int = 3 * 3600
    subnets: list[str] = field(default_factory=list)
    ami: str | None = None
    ami_ssm_parameter: str | None = None
    root_volume_gib: int = 100
    max_hourly_usd: float | None = None
    wait_timeout_s: int = 600


def parse_rungs(text: str) -> list[int]:
    """``"1,100,1000"`` -> ``[1, 100, 1000]``; UsageError saying what to write otherwise."""
    try:
        rungs = [int(p) for p in text.replace(" ", "").split(",") if p]
    except ValueError:
        raise UsageError(f"--rungs {text!r}: give item counts separated by commas, e.g. 1,100,1000") from None
    if not rungs or any(not 1 <= r <= MAX_RUNG for r in rungs):
        raise UsageError(f"--rungs {text!r}: give one or more item counts from 1 to {MAX_RUNG}, e.g. 1,100,1000")
    return rungs


def rung_items(n: int, pool: Sequence[Item] | None) -> list[Item]:
    """``n`` items: the items file's items in turn (repeating when it is shorter), or ``args=[i]``."""
    if not pool:
        return [Item(index=i, args=[i]) for i in range(n)]
    return [Item(index=i, args=pool[i % len(pool)].args, kwargs=pool[i % len(pool)].kwargs) for i in range(n)]


def ramp_spec(opts: RampOptions, name: str) -> CohortSpec:
    market: Market = "spot" if opts.spot else "on-demand"
    return CohortSpec(
        name=name,
        count=1,
        instance_types=[opts.instance_type],
        subnets=opts.subnets,
        market=market,
        ami=opts.ami,
        ami_ssm_parameter=opts.ami_ssm_parameter,
        root_volume=RootVolume(size_gib=opts.root_volume_gib),
        ttl_seconds=opts.ttl_seconds,
        max_hourly_usd=opts.max_hourly_usd,
        wait_timeout_s=opts.wait_timeout_s,
        tags={"calque-ramp": Path(opts.workload.split("::", 1)[0]).name[:200]},
    )


def run_ramp(
    opts: RampOptions,
    acquirer: Acquirer,
    consent: Consent,
    *,
    progress: Callable[[str], None] | None = None,
    on_rung: Callable[[RampRung], None] | None = None,
    on_result: Callable[[ItemResult], None] | None = None,
) -> RampReport:
    """Run the ramp and return its report; the instance is terminated before this returns or raises.

    ``on_rung`` is called after each rung and ``on_result`` after each item (progress displays use
    them); an exception from either ends the ramp like any other error, and the instance still ends.
    """
    from calque.pool.submit import read_items  # the pool's items format, shared
    from calque.warm import WarmSupervisor

    say = progress or (lambda _msg: None)
    pool = read_items(opts.items_file) if opts.items_file else None
    name = f"ramp-{secrets.token_hex(4)}"
    spec = ramp_spec(opts, name)
    report = RampReport(workload=opts.workload, method=opts.method, cohort=name)
    try:
        say(f"acquiring one {opts.instance_type} ({spec.market}) as cohort {name}")
        got = acquirer.apply(spec, consent)
        report.instance = got.instances[0] if got.instances else None
        report.hourly_usd = got.hourly_usd
        say(f"loading {opts.workload} (its @enter runs once, here)")
        sup = WarmSupervisor.load(opts.workload)
        try:
            method = opts.method or sup.default_method()
            if method is None:
                raise UsageError(f"{opts.workload} has several methods {sup.methods}: choose one with --method")
            report.method = method
            report.enter_seconds, report.enter_count = sup.enter_seconds, sup.enter_count
            for k, n in enumerate(opts.rungs):
                say(f"rung {k}: {n} item(s)")
                items = rung_items(n, pool)
                started = time.monotonic()
                drain = sup.drain(method, items, on_result=on_result)
                wall = time.monotonic() - started
                ok = sum(1 for r in drain.results if r.ok)
                rung = RampRung(
                    rung=k,
                    items=n,
                    ok=ok,
                    failed=n - ok,
                    wall_s=round(wall, 4),
                    items_per_s=round(n / wall, 3) if wall > 0 else 0.0,
                    enter_seconds_paid=round(sup.enter_seconds, 4) if k == 0 else 0.0,
                )
                report.rungs.append(rung)
                report.enter_count = sup.enter_count
                if on_rung:
                    on_rung(rung)
        finally:
            errors = sup.close()
            for e in errors:
                say(f"warning: @exit: {e}")
    except BaseException as exc:  # Ctrl-C included: record it, end the instance below, re-raise
        report.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        say(f"terminating cohort {name}")
        try:
            # the ramp's own cohort, made above: ending it is part of what the spend consent covered
            report.terminated = acquirer.release(name, Consent(terminate=True)).terminated
        except CalqueError as exc:
            say(
                f"error: could not terminate cohort {name} ({exc}); end it with the calque.gpu.ec2_cohort "
                f"module (name: {name}, state: absent) or terminate the instances tagged calque:cohort={name}"
            )
            if report.error is None:
                raise
    return report
