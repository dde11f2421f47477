"""The catalog as package data, its CLI view, and the generated support matrix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from calque.cli.main import cli, run
from calque.errors import UsageError
from calque.gpu.catalog import load_catalog, support_matrix_markdown
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
REQUIRED = [
    "A30-24GB", "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB",
    "RTX-PRO-6000-Blackwell-Server-Edition", "RTX-PRO-4500-Blackwell-Server-Edition",
    "L4-24GB", "L40S-48GB", "A10G-24GB",
]  # fmt: skip


def test_support_matrix_doc_is_generated_from_the_catalog() -> None:
    doc = (REPO / "docs" / "gpu-support-matrix.md").read_text(encoding="utf-8")
    assert doc == support_matrix_markdown(), "docs/gpu-support-matrix.md is stale: run scripts/gen-gpu-matrix"


def test_every_required_card_is_in_the_catalog_with_a_consistent_grid() -> None:
    cat = load_catalog()
    assert set(REQUIRED) <= set(cat.cards)
    for key in REQUIRED:
        card = cat.cards[key]
        assert card.mig == bool(card.profiles), key
        for p in card.profiles:
            assert p.placements.size == p.memory_slices, (key, p.name)
            assert all(s >= 0 and s + p.placements.size <= card.placement_units for s in p.placements.starts)
            assert p.max_count <= card.max_instances
        ids = [p.profile_id for p in card.profiles]
        assert len(ids) == len(set(ids)), f"{key}: duplicate profile ids"


def test_uncertain_marks_survive_the_transform() -> None:
    cat = load_catalog()
    h100 = cat.cards["H100-80GB"].profile("4g.40gb")
    assert {"profile_id", "placements", "sms"} <= set(h100.uncertain)
    assert "placements" in cat.cards["H200-141GB"].profile("1g.18gb").uncertain
    assert cat.ec2_families["g7e"].uncertain


def test_instance_type_maps_to_card_and_count() -> None:
    cat = load_catalog()
    card, n = cat.for_instance_type("p5.48xlarge")
    assert (card.key, n) == ("H100-80GB", 8)
    assert cat.ec2_families["g6"].sharing == "mps"
    with pytest.raises(UsageError, match="known sizes"):
        cat.for_instance_type("p5.2xlarge")
    with pytest.raises(UsageError, match="known families"):
        cat.for_instance_type("m5.large")


def test_card_lookup_by_nvml_name_and_bad_profile_names_valid_ones() -> None:
    cat = load_catalog()
    assert cat.card("NVIDIA A100-SXM4-40GB").key == "A100-40GB"
    with pytest.raises(UsageError, match=r"1g\.5gb \(max 7\)"):
        cat.card("A100-40GB").profile("1g.6gb")


def test_cli_catalog_human_and_json_show_the_same_data() -> None:
    r = CliRunner().invoke(cli, ["gpu", "catalog", "--card", "H100-80GB"])
    assert r.exit_code == 0, r.output
    assert "3g.40gb" in r.output and "p5" in r.output
    r = CliRunner().invoke(cli, ["gpu", "catalog", "--json"])
    data = json.loads(r.output)
    assert data["cards"]["A100-40GB"]["profiles"][0]["profile_id"] == 19
    assert run(["gpu", "catalog", "--card", "V100"]) == 2
