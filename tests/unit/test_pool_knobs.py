"""Modal's autoscaler knobs read from a script's decorator (never imported) and resolved against inventory."""

from __future__ import annotations

from pathlib import Path

import pytest
from calque.aws.acquire.scaling import ScalingSettings, desired_scaling
from calque.errors import UsageError
from calque.models.pool_names import pool_names
from calque.ops.pool_knobs import PoolKnobsOp
from calque.pool.submitter.knobs import read_knobs

SCRIPT = """
import modal, torch  # never imported by the reader: torch need not exist

app = modal.App("lab")
WINDOW = 120


@app.cls(gpu="L4", min_containers=2, max_containers=8, buffer_containers=1, scaledown_window=600)
class Current:
    pass


@app.cls(keep_warm=1, concurrency_limit=4, container_idle_timeout=30)
class Older:
    pass


@app.function(max_containers=3, scaledown_window=WINDOW)
def fn(x):
    return x
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "lab.py"
    path.write_text(SCRIPT)
    return path


def resolve(workload: str, **inventory: int) -> dict[str, tuple[int | None, str]]:
    op = PoolKnobsOp()
    out = op.run(op.request({"script": workload, **inventory})).result
    return {k: (getattr(out, k).value, getattr(out, k).source) for k in ("min_size", "max_size", "buffer", "idle_s")}


def test_the_current_names_become_the_groups_and_the_scalings_defaults(script: Path) -> None:
    got = resolve(f"{script}::Current")
    assert got["min_size"] == (2, "script: min_containers=2 on Current")
    assert got["max_size"] == (8, "script: max_containers=8 on Current")
    assert got["buffer"] == (1, "script: buffer_containers=1 on Current")
    assert got["idle_s"] == (600, "script: scaledown_window=600 on Current")


def test_inventory_overrides_the_script_and_workers_per_instance_divide_containers(script: Path) -> None:
    got = resolve(f"{script}::Current", min_size=0, idle_s=900, workers=3)
    assert got["min_size"] == (0, "inventory (calque_pool_group.min_size)")
    assert got["idle_s"] == (900, "inventory (calque_pool_scaling.idle_s)")
    assert got["max_size"] == (3, "script: max_containers=8 on Current, / 3 workers per instance")  # ceil(8 / 3)


def test_older_names_are_mapped_and_short_windows_meet_cloudwatchs_minute(script: Path) -> None:
    knobs = read_knobs(f"{script}::Older")
    assert knobs is not None and (knobs.min_containers, knobs.max_containers, knobs.scaledown_window) == (1, 4, 30)
    assert "keep_warm is Modal's older name for min_containers" in knobs.notes
    got = resolve(f"{script}::Older")
    assert got["idle_s"][0] == 60 and "raised to 60s" in got["idle_s"][1]


def test_a_non_literal_value_is_left_to_inventory_and_an_unnamed_target_of_several_reads_nothing(
    script: Path,
) -> None:
    knobs = read_knobs(f"{script}::fn")
    assert knobs is not None and knobs.max_containers == 3 and knobs.scaledown_window is None
    assert any("scaledown_window is not a literal" in n for n in knobs.notes)
    assert read_knobs(str(script)) is None  # three targets, none named
    assert resolve(str(script), count=2)["max_size"] == (2, "inventory (calque_pool_group.count)")
    with pytest.raises(UsageError, match="cannot read workload script"):
        read_knobs(str(script.parent / "missing.py"))


def test_buffer_counts_buffer_times_target_more_claims_in_the_backlog_metric() -> None:
    names = pool_names("lab-a/embedder")
    plain = desired_scaling(names, ScalingSettings(seconds_per_claim=6, latency_s=600))
    buffered = desired_scaling(names, ScalingSettings(seconds_per_claim=6, latency_s=600, buffer=1))
    policy = buffered.policies[f"{names.base}-backlog"]["TargetTrackingConfiguration"]
    metrics = policy["CustomizedMetricSpecification"]["Metrics"]
    expr = next(m["Expression"] for m in metrics if m["Id"] == "backlog_per_instance")
    assert expr == "(visible + inflight + 100) / inservice"  # target 100 claims per instance, 1 instance more
    assert plain.policies != buffered.policies
