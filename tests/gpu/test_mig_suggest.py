"""``calque gpu mig suggest`` on recorded histories: real registries written by the daemon's Registry,
a simulated host of two H100s, and the planner applying what is suggested."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from calque.cli.main import run
from calque.gpu.layout import load_layout
from calque.gpu.planner import MigPlanner
from calque.gpu.sim import SimGpu
from support.demand import DAY, began_recording, fortnight, slices_of


@pytest.fixture
def teaching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimGpu:
    """GPU 0: 7 x 1g.10gb; GPU 1: 2 x 3g.40gb (one slice of it unused)."""
    sim = SimGpu.create(tmp_path / "gpus.json", ["H100-80GB", "H100-80GB"])
    sim.enable_mig()
    sim.create_instances(0, ["1g.10gb"] * 7)
    sim.create_instances(1, ["3g.40gb"] * 2)
    cfg = tmp_path / "host.yaml"
    cfg.write_text(f"gpu:\n  backend: sim\n  sim: {{state: {sim.state_path}}}\n")
    monkeypatch.setenv("CALQUE_HOST_CONFIG", str(cfg))
    return sim


def _history(tmp_path: Path, sim: SimGpu, **kw: object) -> Path:
    start = time.time() - 14 * DAY
    path = tmp_path / "state" / "sessions.db"
    fortnight(path, slices_of(sim), start, **kw).close()  # type: ignore[arg-type]
    began_recording(path, start)
    return path


def _suggest(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:  # type: ignore[type-arg]
    assert run(["gpu", "mig", "suggest", "--registry", str(path), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_refused_1g_and_idle_3g_turn_one_3g_into_four_1g_and_say_why(
    teaching: SimGpu, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every 1g slice busy 09-17 each day and three more 1g asks refused at 10:00; one 3g of two in use.
    path = _history(tmp_path, teaching, refused_per_day={"1g.10gb": 3}, in_use={"3g.40gb": 1})
    out = tmp_path / "suggested.yaml"
    s = _suggest(path, capsys, "--output", str(out))
    gpus = {g["index"]: g for g in s["gpus"]}
    # what a person would do: keep GPU 0, give up the idle 3g on GPU 1 for four 1g (the whole card used)
    assert not gpus[0]["changed"] and gpus[0]["after"] == {"1g.10gb": 7}
    assert gpus[1]["changed"] and gpus[1]["after"] == {"3g.40gb": 1, "1g.10gb": 4}
    prof = {p["profile"]: p for p in s["profiles"]}
    assert prof["1g.10gb"]["refused_asks"] == 42 and prof["1g.10gb"]["peak_in_use"] == 7
    assert (prof["1g.10gb"]["replayed_refusals_now"], prof["1g.10gb"]["replayed_refusals_suggested"]) == (42, 0)
    assert prof["3g.40gb"]["peak_in_use"] == 1 and prof["3g.40gb"]["slices_suggested"] == 1
    assert prof["3g.40gb"]["replayed_refusals_suggested"] == 0
    assert prof["3g.40gb"]["slice_hours_idle"] == pytest.approx(2 * 14 * 24 - 14 * 8, abs=0.1)
    assert s["changed"] and s["refusals_avoided"] == 42
    why = "\n".join(s["reasons"])
    assert "1g.10gb gains 4 slice(s): 42 asks refused" in why and "3g.40gb loses 1 slice(s)" in why
    assert "none of its asks would have been refused" in why
    # mig-parted's format, read back by the planner's own loader
    doc = yaml.safe_load(out.read_text())
    assert doc["version"] == "v1" and doc == s["layout"]
    assert doc["mig-configs"]["calque-suggested"][1] == {
        "devices": [1], "mig-enabled": True, "mig-devices": {"1g.10gb": 4, "3g.40gb": 1}
    }  # fmt: skip
    # the human view says the same
    assert run(["gpu", "mig", "suggest", "--registry", str(path)]) == 0
    text = capsys.readouterr().out
    assert "avoids 42 of the refusals replayed" in text and "GPU 1 (H100-80GB)" in text and "version: v1" in text


def test_the_plan_of_a_suggestion_leaves_the_unchanged_gpus_instances_untouched(
    teaching: SimGpu, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _history(tmp_path, teaching, refused_per_day={"1g.10gb": 3}, in_use={"3g.40gb": 1})
    out = tmp_path / "suggested.yaml"
    _suggest(path, capsys, "--output", str(out))
    gpu0 = sorted((d.uuid, d.gi_id, d.placement_start) for d in teaching.mig_devices() if d.gpu_index == 0)
    kept_3g = {d.uuid for d in teaching.mig_devices() if d.gpu_index == 1}
    _, entries = load_layout(out).select(None)
    plan = MigPlanner(teaching).plan(entries)
    by = {g.index: g for g in plan.gpus}
    assert by[0].ops == [] and by[0].before == by[0].after
    kinds = [op.kind for op in by[1].ops]
    assert kinds.count("destroy_gi") == 1 and kinds.count("create_gi") == 4 and "reset" not in kinds
    assert run(["gpu", "mig", "apply", "--config", str(out), "--json"]) == 0
    capsys.readouterr()
    assert sorted((d.uuid, d.gi_id, d.placement_start) for d in teaching.mig_devices() if d.gpu_index == 0) == gpu0
    after1 = [d for d in teaching.mig_devices() if d.gpu_index == 1]
    assert sorted(d.profile for d in after1) == ["1g.10gb"] * 4 + ["3g.40gb"]
    assert len(kept_3g & {d.uuid for d in after1}) == 1  # one 3g instance kept as it was
    # applied, the suggestion now proposes nothing further from the same history
    assert MigPlanner(teaching).plan(entries).changes is False


def test_a_history_without_refusals_suggests_no_change(
    teaching: SimGpu, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _history(tmp_path, teaching, in_use={"3g.40gb": 1})
    s = _suggest(path, capsys)
    assert s["changed"] is False and s["refusals_avoided"] == 0
    assert [g["after"] for g in s["gpus"]] == [{"1g.10gb": 7}, {"3g.40gb": 2}]
    assert any("no checkout of a MIG slice was refused" in r for r in s["reasons"])
    _, entries = load_layout_from(s["layout"], tmp_path)
    assert MigPlanner(teaching).plan(entries).changes is False


@pytest.mark.parametrize(("refused_1g", "changes"), [(1, False), (2, False), (4, True)])
def test_a_refused_3g_ask_weighs_three_refused_1g_asks(
    teaching: SimGpu, tmp_path: Path, capsys: pytest.CaptureFixture[str], refused_1g: int, changes: bool
) -> None:
    # Both 3g slices are in use whenever 1g asks are refused: taking one 3g for four 1g refuses one 3g
    # ask a day (three slices) to grant up to four 1g asks. Worth it only when more than three 1g were refused.
    path = _history(tmp_path, teaching, refused_per_day={"1g.10gb": refused_1g})
    s = _suggest(path, capsys)
    assert s["changed"] is changes
    prof = {p["profile"]: p for p in s["profiles"]}
    if changes:
        assert (
            prof["3g.40gb"]["replayed_refusals_suggested"] == 14 and prof["1g.10gb"]["replayed_refusals_suggested"] == 0
        )
        assert any(
            "3g.40gb loses 1 slice(s)" in r and "14 of its asks would have been refused" in r for r in s["reasons"]
        )
    else:
        assert any("no valid layout of this host's GPUs refuses fewer" in r for r in s["reasons"])


def load_layout_from(doc: dict, tmp_path: Path) -> tuple[str, list]:  # type: ignore[type-arg]
    f = tmp_path / "layout.yaml"
    f.write_text(yaml.safe_dump(doc))
    return load_layout(f).select(None)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no session registry at"),
        (b"", "is empty: not a session registry"),
        (b"this is not sqlite at all\n" * 40, "is not a session registry this calque can read"),
    ],
)
def test_a_missing_empty_or_garbage_registry_is_a_clear_usage_error(
    teaching: SimGpu, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, message: str
) -> None:
    path = tmp_path / "sessions.db"
    if content is not None:
        path.write_bytes(content)
    assert run(["gpu", "mig", "suggest", "--registry", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    if content is not None:
        assert path.read_bytes() == content  # read-only: the file is as it was


def test_an_older_registry_and_an_empty_window_say_what_to_do(
    teaching: SimGpu, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    old = tmp_path / "old.db"
    db = sqlite3.connect(old)
    db.executescript("CREATE TABLE sessions(id TEXT); CREATE TABLE usage(session_id TEXT); PRAGMA user_version=4;")
    db.close()
    assert run(["gpu", "mig", "suggest", "--registry", str(old)]) == 2
    assert "schema 4 registry, which records no refused checkouts" in capsys.readouterr().err
    assert run(["gpu", "mig", "suggest", "--registry", str(old), "--since", "-3d"]) == 2
    assert "--since" in capsys.readouterr().err
    path = _history(tmp_path, teaching, days=1, refused_per_day={"1g.10gb": 2})
    # a window after every recorded session: nothing to go on, so no change, and it says so
    s = _suggest(path, capsys, "--since", "1h")
    assert s["changed"] is False and s["profiles"][0]["slice_hours_used"] == 0
    # a layout file that cannot be written is a sentence, not a traceback
    assert run(["gpu", "mig", "suggest", "--registry", str(path), "-o", str(tmp_path / "missing" / "x.yaml")]) == 2
    err = capsys.readouterr().err
    assert "cannot write the suggested layout to" in err and "No such file or directory" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("split", "entry"),
    [
        ([1, 1, 1], {"mig-devices": {"1c.3g.40gb": 6}}),  # mig-parted's own key for alike splits
        ([1, 2], {"mig-devices": {"3g.40gb": 2}, "compute-instances": {"3g.40gb": [1, 2]}}),
    ],
)
def test_an_unchanged_gpu_keeps_its_compute_instance_splits_in_the_suggestion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], split: list[int], entry: dict
) -> None:  # type: ignore[type-arg]
    sim = SimGpu.create(tmp_path / "gpus.json", ["H100-80GB", "H100-80GB"])
    sim.enable_mig()
    sim.create_instances(0, ["3g.40gb"] * 2, compute_split=split)
    sim.create_instances(1, ["1g.10gb"] * 7)
    cfg = tmp_path / "host.yaml"
    cfg.write_text(f"gpu:\n  backend: sim\n  sim: {{state: {sim.state_path}}}\n")
    monkeypatch.setenv("CALQUE_HOST_CONFIG", str(cfg))
    # 1g asks refused, and GPU 0's 3g slices busy: no change helps, so GPU 0 is written as it is
    path = _history(tmp_path, sim, days=2, refused_per_day={"1g.10gb": 1})
    s = _suggest(path, capsys)
    assert s["changed"] is False
    assert s["layout"]["mig-configs"]["calque-suggested"][0] == {"devices": [0], "mig-enabled": True, **entry}
    _, entries = load_layout_from(s["layout"], tmp_path)
    assert MigPlanner(sim).plan(entries).changes is False  # splits and all: nothing to do


def test_a_host_with_no_gpu_in_mig_mode_has_nothing_to_suggest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = SimGpu.create(tmp_path / "gpus.json", ["L40S-48GB"])
    cfg = tmp_path / "host.yaml"
    cfg.write_text(f"gpu:\n  backend: sim\n  sim: {{state: {sim.state_path}}}\n")
    monkeypatch.setenv("CALQUE_HOST_CONFIG", str(cfg))
    path = tmp_path / "state" / "sessions.db"
    fortnight(path, [], time.time() - DAY, days=1).close()
    assert run(["gpu", "mig", "suggest", "--registry", str(path)]) == 2
    assert "no GPU in MIG mode" in capsys.readouterr().err
