"""MIG layouts: plan then apply, minimal changes, busy instances protected, resets only when allowed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from calque.errors import UsageError
from calque.gpu.catalog import load_catalog
from calque.gpu.layout import LayoutEntry, load_layout, parse_entries
from calque.gpu.nvml_errors import BusyInstancesError, LayoutError
from calque.gpu.placement import place
from calque.gpu.planner import MigPlanner
from calque.gpu.sim import SimGpu
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

Make = Callable[..., SimGpu]
CAT = load_catalog()
MIG_CARDS = [k for k, c in CAT.cards.items() if c.mig]


def layout(devices: dict[str, int] | None = None, *, mig: bool = True, **kw: object) -> list[LayoutEntry]:
    return parse_entries([{"devices": "all", "mig-enabled": mig, "mig-devices": devices or {}, **kw}])


def converge(sim: SimGpu, entries: list[LayoutEntry], **kw: object) -> int:
    planner = MigPlanner(sim)
    plan = planner.plan(entries, force=bool(kw.pop("force", False)))
    res = planner.apply(plan, allow_reset=True, **kw)  # type: ignore[arg-type]
    assert not res.reset_required
    return sum(len(g.done) for g in res.gpus)


def profiles_on(sim: SimGpu, index: int = 0) -> Counter[str]:
    return Counter(gi.profile for gi in sim.gpu_instances(index))


@pytest.mark.parametrize("key", MIG_CARDS)
def test_every_card_accepts_a_full_layout_of_its_smallest_profile(make_sim: Make, key: str) -> None:
    card = CAT.cards[key]
    small = min((p for p in card.profiles if not p.media_extension), key=lambda p: (p.memory_slices, p.profile_id))
    sim = make_sim([key])
    converge(sim, layout({small.name: small.max_count}))
    assert profiles_on(sim) == Counter({small.name: small.max_count})
    assert MigPlanner(sim).plan(layout({small.name: small.max_count})).changes is False


@pytest.mark.parametrize("key", MIG_CARDS)
def test_every_card_refuses_counts_over_max_and_names_the_valid_profiles(make_sim: Make, key: str) -> None:
    card = CAT.cards[key]
    p = card.profiles[0]
    sim = make_sim([key], mig=True)
    with pytest.raises(LayoutError) as exc:
        MigPlanner(sim).plan(layout({p.name: p.max_count + 1}))
    msg = str(exc.value)
    assert f"{p.name} (max {p.max_count})" in msg and card.profiles[-1].name in msg
    assert exc.value.exit_code == 2
    me = [q for q in card.profiles if q.media_extension]
    if len(me) > 1:  # a second +me of another profile
        with pytest.raises(LayoutError, match=r"\+me"):
            MigPlanner(sim).plan(layout({me[0].name: 1, me[1].name: 1}))
    elif me:
        with pytest.raises(LayoutError, match="max count 1"):
            MigPlanner(sim).plan(layout({me[0].name: 2}))


def test_unknown_profile_fails_before_any_change_naming_valid_ones(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB", "A100-40GB"], mig=True)
    entries = parse_entries(
        [
            {"devices": 0, "mig-enabled": True, "mig-devices": {"1g.5gb": 7}},
            {"devices": [1], "mig-enabled": True, "mig-devices": {"1g.6gb": 1}},
        ]
    )
    with pytest.raises(LayoutError, match=r"1g\.5gb \(max 7\)"):
        MigPlanner(sim).plan(entries)
    assert sim.mig_devices() == []


def test_a100_seven_1g_to_3_2_1_1_keeps_two_instances_at_their_placements(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB"], mig=True)
    converge(sim, layout({"1g.5gb": 7}))
    before = {(d.placement_start, d.uuid) for d in sim.mig_devices()}
    plan = MigPlanner(sim).plan(layout({"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}))
    kinds = Counter(op.kind for op in plan.gpus[0].ops)
    assert kinds == Counter({"destroy_ci": 5, "destroy_gi": 5, "create_gi": 2})
    converge(sim, layout({"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}))
    after = {(d.placement_start, d.uuid) for d in sim.mig_devices()}
    assert len(before & after) == 2  # two 1g instances kept, with their UUIDs, at their placements
    assert profiles_on(sim) == Counter({"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2})


def test_only_gpus_whose_layout_differs_are_touched(make_sim: Make) -> None:
    sim = make_sim(instance_type="p5.48xlarge", mig=True)
    converge(sim, layout({"1g.10gb": 7}))
    uuids = {d.uuid for d in sim.mig_devices() if d.gpu_index != 3}
    entries = parse_entries(
        [
            {"devices": [0, 1, 2, 4, 5, 6, 7], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
            {"devices": 3, "mig-enabled": True, "mig-devices": {"3g.40gb": 1, "1g.10gb": 4}},
        ]
    )
    plan = MigPlanner(sim).plan(entries)
    assert [g.index for g in plan.gpus if g.ops] == [3]
    assert converge(sim, entries) == 7  # 3 CI + 3 GI destroys, 1 create
    assert uuids <= {d.uuid for d in sim.mig_devices()}


def test_busy_instances_are_never_destroyed_without_force(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB"], mig=True)
    converge(sim, layout({"1g.5gb": 7}))
    busy = next(d for d in sim.mig_devices() if d.placement_start == 5)
    sim.set_processes(busy.uuid, [4242])
    target = layout({"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2})
    with pytest.raises(BusyInstancesError, match="4242") as exc:
        MigPlanner(sim).plan(target)
    assert exc.value.exit_code == 4
    assert len(sim.mig_devices()) == 7
    plan = MigPlanner(sim).plan(target, force=True)
    assert [b.pids for b in plan.gpus[0].busy_destroyed] == [[4242]]
    converge(sim, target, force=True)
    assert sim.processes() == [] and profiles_on(sim)["3g.20gb"] == 1


def test_a_busy_instance_the_layout_keeps_is_left_running(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB"], mig=True)
    converge(sim, layout({"1g.5gb": 7}))
    busy = next(d for d in sim.mig_devices() if d.placement_start == 3)
    sim.set_processes(busy.uuid, [77])
    converge(sim, layout({"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}))
    assert busy.uuid in {d.uuid for d in sim.mig_devices()}
    assert [p.pid for p in sim.processes()] == [77]


def test_idempotent_reapply_does_nothing(make_sim: Make) -> None:
    sim = make_sim(["H100-80GB"], mig=True)
    target = layout({"3g.40gb": 1, "1g.10gb": 4}, **{"compute-instances": {"3g.40gb": [1, 2]}})
    converge(sim, target)
    planner = MigPlanner(sim)
    res = planner.apply(planner.plan(target))
    assert res.changed is False and not res.reset_required
    assert {d.ci_profile for d in res.mig_devices} == {"1c.3g.40gb", "2c.3g.40gb", None}


def test_changing_a_compute_split_recreates_only_those_cis(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB"], mig=True)
    converge(sim, layout({"3g.20gb": 2}))
    plan = MigPlanner(sim).plan(layout({"3g.20gb": 2}, **{"compute-instances": {"3g.20gb": [1, 1, 1]}}))
    assert Counter(op.kind for op in plan.gpus[0].ops) == Counter({"destroy_ci": 2, "create_ci": 2})


def test_mig_mode_change_waits_for_an_allowed_reset(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB"])
    planner = MigPlanner(sim)
    target = layout({"7g.40gb": 1})
    res = planner.apply(planner.plan(target))
    assert res.changed and res.reset_required and sim.gpus()[0].mig_pending and not sim.gpus()[0].mig_current
    again = planner.apply(planner.plan(target))
    assert again.changed is False and again.reset_required
    res = planner.apply(planner.plan(target), allow_reset=True)
    assert [d.profile for d in res.mig_devices] == ["7g.40gb"] and not res.reset_required


@pytest.mark.parametrize(
    ("hold", "expect"),
    [
        (lambda s: s.set_persistence_mode(0, True), "persistence"),
        (lambda s: s.set_holders(0, ["nvidia_drm"]), "nvidia_drm"),
    ],
)
def test_reset_blocked_by_persistence_or_nvidia_drm_is_explained(
    make_sim: Make, hold: Callable[[SimGpu], None], expect: str
) -> None:
    sim = make_sim(["H100-80GB"])
    hold(sim)
    planner = MigPlanner(sim)
    res = planner.apply(planner.plan(layout({"1g.10gb": 1})), allow_reset=True)
    assert res.reset_required and res.gpus[0].blocked and expect in res.gpus[0].blocked
    assert sim.gpus()[0].mig_pending and not sim.gpus()[0].mig_current


def test_platform_without_reset_reports_a_reboot(make_sim: Make) -> None:
    sim = make_sim(["H200-141GB"])
    sim.set_reset_supported(0, False)
    planner = MigPlanner(sim)
    res = planner.apply(planner.plan(layout({"1g.18gb": 7})), allow_reset=True)
    assert res.reboot_required
    sim.reboot()
    res = planner.apply(planner.plan(layout({"1g.18gb": 7})))
    assert len(res.mig_devices) == 7 and not res.reboot_required


def test_disabling_mig_destroys_instances_then_resets(make_sim: Make) -> None:
    sim = make_sim(["A30-24GB"], mig=True)
    converge(sim, layout({"2g.12gb": 2}))
    converge(sim, layout(mig=False))
    g = sim.gpus()[0]
    assert (g.mig_current, g.mig_pending) == (False, False)


def test_mig_on_a_mig_less_card_says_use_mps(make_sim: Make) -> None:
    sim = make_sim(["L40S-48GB"])
    with pytest.raises(LayoutError, match="MPS"):
        MigPlanner(sim).plan(layout({"1g.5gb": 1}))


def test_layout_file_is_versioned_and_strict(tmp_path: Path) -> None:
    f = tmp_path / "mig.yaml"
    f.write_text(
        "version: 1\nmig-configs:\n  a: [{devices: all, mig-enabled: true, mig-devices: {1g.5gb: 7}}]\n  b: []\n"
    )
    assert load_layout(f).select("a")[1][0].mig_devices == {"1g.5gb": 7}
    with pytest.raises(UsageError, match="--select"):
        load_layout(f).select(None)
    f.write_text("version: 2\nmig-configs: {}\n")
    with pytest.raises(UsageError, match="version 2"):
        load_layout(f)
    f.write_text("version: 1\nmig-configs:\n  a: [{devices: all, mig-enable: true}]\n")
    with pytest.raises(UsageError, match="mig-enable"):
        load_layout(f)


def test_device_filter_selects_by_card(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB", "H100-80GB"], mig=True)
    entries = parse_entries([{"device-filter": "H100-80GB", "mig-enabled": True, "mig-devices": {"7g.80gb": 1}}])
    converge(sim, entries)
    assert sim.gpu_instances(0) == [] and profiles_on(sim, 1) == Counter({"7g.80gb": 1})


def _random_layout(card_key: str, data: st.DataObject) -> dict[str, int]:
    card = CAT.cards[card_key]
    chosen: list = []
    for _ in range(data.draw(st.integers(0, 7))):
        p = data.draw(st.sampled_from(card.profiles))
        if place(card, [], [*chosen, p]) is not None:
            chosen.append(p)
    return dict(Counter(p.name for p in chosen))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), card_key=st.sampled_from(MIG_CARDS))
def test_transitions_reach_the_target_minimally_and_idempotently(
    tmp_path: Path, data: st.DataObject, card_key: str
) -> None:
    sim = SimGpu.create(tmp_path / f"t-{card_key}.json", [card_key], mig=True)
    a, b = _random_layout(card_key, data), _random_layout(card_key, data)
    converge(sim, layout(a))
    assert profiles_on(sim) == Counter(a)
    before = {(gi.profile, gi.placement_start) for gi in sim.gpu_instances(0)}
    plan = MigPlanner(sim).plan(layout(b))
    destroys = sum(op.kind == "destroy_gi" for op in plan.gpus[0].ops)
    creates = sum(op.kind == "create_gi" for op in plan.gpus[0].ops)
    assert destroys <= sum(a.values()) and creates <= sum(b.values())
    assert sum(a.values()) - destroys == sum(b.values()) - creates  # kept instances count on both sides
    converge(sim, layout(b))
    assert profiles_on(sim) == Counter(b)
    after = {(gi.profile, gi.placement_start) for gi in sim.gpu_instances(0)}
    assert len(before & after) >= sum(a.values()) - destroys
    assert MigPlanner(sim).plan(layout(b)).changes is False


def test_instances_the_catalog_does_not_know_are_shown_and_refused_clearly(make_sim: Make) -> None:
    from calque.gpu.planner import catalog_profile, current_layout
    from calque.models import GpuInstance

    sim = make_sim(["A100-40GB"], mig=True)
    odd = GpuInstance(gpu_index=0, gi_id=3, profile="1g.5gb+gfx", profile_id=99, placement_start=0, placement_size=1)
    with pytest.raises(LayoutError, match="calque gpu verify"):
        catalog_profile(CAT.cards["A100-40GB"], odd)
    assert current_layout(sim).gpus[0].layout.mig_enabled is True


def test_an_invalid_compute_split_fails_before_anything_changes(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB"], mig=True)
    converge(sim, layout({"1g.5gb": 7}))
    with pytest.raises(LayoutError, match=r"valid sizes: \[1, 2, 3, 4, 6, 7\]"):
        MigPlanner(sim).plan(layout({"7g.40gb": 1}, **{"compute-instances": {"7g.40gb": [5, 2]}}))
    with pytest.raises(LayoutError, match="exceed"):
        MigPlanner(sim).plan(layout({"3g.20gb": 2}, **{"compute-instances": {"3g.20gb": [2, 2]}}))
    assert len(sim.mig_devices()) == 7
