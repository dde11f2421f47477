"""The rates table: every row is well formed, and an unknown type is refused with the known ones named."""

from __future__ import annotations

import pytest
from calque.aws import pricing
from calque.errors import UsageError


def test_every_row_has_price_shape_source_and_date() -> None:
    table = pricing.rates_table()
    assert table.region == "us-east-1"
    for name, row in table.types.items():
        assert row.usd_per_hour > 0, name
        assert row.vcpus >= 4 and row.gpus >= 1, name
        assert row.source and row.as_of[:2] == "20", name


@pytest.mark.parametrize(
    "family", ["g4dn", "g5", "g6", "g6e", "g7", "g7e", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200"]
)
def test_table_covers_the_gpu_families(family: str) -> None:
    assert any(pricing.family(t) == family for t in pricing.known_types())


def test_hourly_usd_and_shape_of_a_known_type() -> None:
    assert pricing.hourly_usd("g6.xlarge") == pytest.approx(0.8048)
    assert pricing.vcpus("p5.48xlarge") == 192
    assert pricing.gpus("g5.12xlarge") == 4


def test_unknown_type_names_the_known_types_of_its_family() -> None:
    with pytest.raises(UsageError) as err:
        pricing.hourly_usd("g6.nano")
    assert "g6.xlarge" in str(err.value) and "g5.xlarge" not in str(err.value)
    with pytest.raises(UsageError, match=r"known types: .*g4dn\.xlarge"):
        pricing.hourly_usd("x9.tiny")
