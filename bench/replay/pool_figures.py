"""The modelled side of the pool replay: AWS's and Modal's figures, each with its source and a range.

Every row of ``python -m bench.replay.pools`` runs at both ends of these ranges ("fast" and "slow").
What is calque's own (the backlog target, the alarms and policies, the warm pool's document, the
schedule's actions, the Modal knobs' mapping) is imported in ``pool_group_sim`` and never restated here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    fast: float
    slow: float
    source: str


@dataclass(frozen=True)
class Ends:
    """One end of every range: the figures a run uses."""

    name: str
    boot_s: float  # launch to a booted OS (AWS)
    bootstrap_s: float  # the user-data: driver check, wheelhouse install, workload download (calque's)
    warm_start_s: float  # a Stopped warm-pool instance started back into service (AWS)
    enter_s: float  # the workload's @enter, cold (weights downloaded)
    warm_enter_s: float  # @enter from the instance's local weight cache
    modal_start_s: float  # a Modal container's start, before @enter
    snapshot_speedup: float  # how much faster @enter restores from a Modal memory snapshot
    metric_lag_s: float  # between the queue's state and the alarm that acts on it


FIGURES: dict[str, Figure] = {
    "boot_s": Figure(
        40,
        80,
        "EC2 RunInstances to a booted OS: 'from 40 seconds' (depot.dev, 'Making EC2 boot time 8x faster', "
        "2024-05-23), 'bi-modal boot times (tens vs ~80s)' (HN discussion of it, 2024-05); read 2026-12-07",
    ),
    "bootstrap_s": Figure(
        60, 180, "calque's user-data (driver check, wheelhouse install, workload download): assumed, not measured"
    ),
    "warm_start_s": Figure(
        30,
        90,
        "a warm-pool instance 'can be launched to serve traffic in as low as 30 seconds' (AWS Compute Blog, "
        "'Scaling your applications faster with EC2 Auto Scaling Warm Pools', 2021-04-08); 90 s: assumed for a "
        "GPU instance's driver load at start (not measured)",
    ),
    "enter_s": Figure(30, 120, "the workload's @enter loading its model cold: assumed (the trace has no workload)"),
    "warm_enter_s": Figure(15, 60, "@enter from the local weight cache: assumed, half the cold @enter"),
    "modal_start_s": Figure(
        2,
        10,
        "Modal container start before @enter: 'sub-second' containers are Modal's claim; a GPU container "
        "assumed 2-10 s (modal.com/docs/guide/cold-start gives no figure; read 2026-12-07)",
    ),
    "snapshot_speedup": Figure(
        10,
        3,
        "memory snapshots: 'practical initialization-heavy Functions often start up 3-10x faster' "
        "(modal.com/docs/guide/memory-snapshots, read 2026-12-07)",
    ),
    "metric_lag_s": Figure(
        60, 180, "CloudWatch 1-minute metrics and alarm evaluation: one to three periods (assumed within AWS's docs)"
    ),
}

AWS_DOCS = {
    "termination": "AWS EC2 Auto Scaling User Guide, 'Configure termination policies' "
    "(docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-termination-policies.html, read 2026-12-07): "
    "balance Availability Zones first; default policy: oldest launch template, then closest to the next billing "
    "hour, then random; instances protected from scale-in are never chosen (calque's worker protects its "
    "instance while it holds a claim: calque.pool.worker.instance)",
    "target_tracking": "target tracking (AWS EC2 Auto Scaling User Guide, 'Target tracking scaling policies'): "
    "scale out to ceil(in service x metric / target) after 3 one-minute datapoints above target, scale in "
    "after 15 below 90 % of it (the alarms AWS creates for a policy on a 1-minute metric)",
    "warm_pool": "warm pool size = max(MinSize, MaxGroupPreparedCapacity (default: the group's max) - desired) "
    "(AWS EC2 Auto Scaling User Guide, 'Warm pools', core concepts); ReuseOnScaleIn stops instances back into it",
    "stopped": "a stopped instance bills its EBS volume only: 100 GiB gp3 at $0.08/GB-month (aws.amazon.com/ebs/"
    "pricing, us-east-1 list price, as bench/pool_scaling.py) = $0.011/h",
    "modal": "Modal reuses a warm container for the next input and starts one when none is free "
    "(modal.com/docs/guide/cold-start); an idle container stops after scaledown_window, default 60 s "
    "(Modal's @app.cls/@app.function reference); billed per second while it runs, idle included",
}
EBS_USD_PER_STOPPED_H = 100 * 0.08 / 730


def ends() -> tuple[Ends, Ends]:
    def at(side: str) -> Ends:
        return Ends(side, **{k: getattr(f, side) for k, f in FIGURES.items()})

    return at("fast"), at("slow")
