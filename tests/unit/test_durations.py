"""The one duration grammar: every spelling people write, refusals that give examples, format/parse round trips."""

from __future__ import annotations

import math

import pytest
from calque.durations import DurationError, format_duration, parse_duration, parse_seconds
from calque.errors import UsageError
from calque.models import CohortSpec, PoolSpec, QueueSettings
from calque.session.session_config import SessionConfig
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("90m", 5400),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("1.5h", 5400),
        ("2d", 172800),
        ("2d 4h", 187200),
        (" 7D ", 604800),
        ("0.5s", 0.5),
        (600, 600),
        (2.5, 2.5),
        ("0", 0),
    ],
)
def test_every_documented_spelling_reads(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", " ", "2x", "h", "1h 30", "30m1h", "1h1h", "forever", "1 hour", "nan", "inf", "1e3", "--5m"]
)
def test_garbage_is_refused_with_examples(text: str) -> None:
    with pytest.raises(DurationError, match=r"e\.g\. 90, 90s, 30m, 1\.5h, 1h30m, '1h 30m' or 2d"):
        parse_duration(text, what="--ttl")


@pytest.mark.parametrize("value", ["-5m", "-5", -1, -0.5])
def test_negative_durations_are_refused(value: str | float) -> None:
    with pytest.raises(DurationError, match="negative"):
        parse_duration(value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused(value: float) -> None:
    with pytest.raises(DurationError, match="finite"):
        parse_duration(value)


def test_a_refusal_names_the_option_and_is_both_a_usage_error_and_a_value_error() -> None:
    with pytest.raises(DurationError) as err:
        parse_duration("3 hours", what="--ttl")
    assert str(err.value).startswith("--ttl '3 hours' is not a duration")
    assert isinstance(err.value, UsageError) and isinstance(err.value, ValueError)
    with pytest.raises(DurationError, match="must be a number of seconds"):
        parse_duration(True)  # a YAML 'yes' is not a duration


def test_whole_seconds_round() -> None:
    assert parse_seconds("1.5h") == 5400 and parse_seconds("1.4s") == 1


@given(st.integers(min_value=0, max_value=10 * 365 * 86400))
def test_formatting_then_parsing_whole_seconds_round_trips(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.integers(min_value=0, max_value=10 * 365 * 86400 * 1_000_000))
def test_formatting_then_parsing_microseconds_round_trips(micros: int) -> None:
    seconds = micros / 1_000_000
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, abs=1e-6)


@given(st.integers(min_value=0, max_value=10 * 365 * 86400))
def test_formatting_is_canonical(seconds: int) -> None:
    text = format_duration(seconds)
    assert format_duration(parse_duration(text)) == text
    assert " " not in text and text[-1] in "dhms"


def test_formatting_reads_like_the_examples() -> None:
    assert [format_duration(s) for s in (0, 90, 5400, 86400, 90061.5)] == ["0s", "1m30s", "1h30m", "1d", "1d1h1m1.5s"]


def test_every_model_field_that_holds_seconds_takes_the_grammar() -> None:
    spec = CohortSpec.model_validate(
        {"name": "lab", "count": 1, "instance_types": ["g6.xlarge"], "ttl_seconds": "1h 30m"}
    )
    assert spec.ttl_seconds == 5400
    pool = PoolSpec.model_validate({"model": "m", "workload": "w.py", "bucket": "bkt", "idle_timeout_s": "10m"})
    assert pool.idle_timeout_s == 600
    assert QueueSettings(visibility_timeout="5m", message_retention="4d").visibility_timeout == 300  # type: ignore[arg-type]
    cfg = SessionConfig.model_validate({"default_ttl": "1.5h", "policy": {"default": {"max_ttl": "1h30m"}}})
    assert cfg.default_ttl == 5400 and cfg.policy.default.max_ttl == 5400


def test_a_bad_duration_in_a_model_names_the_field_and_gives_examples() -> None:
    with pytest.raises(ValidationError) as err:
        PoolSpec.model_validate({"model": "m", "workload": "w.py", "bucket": "bkt", "idle_timeout_s": "ten minutes"})
    assert "idle_timeout_s" in str(err.value) and "e.g. 90, 90s" in str(err.value)


def test_time_left_is_shown_in_the_grammar_people_type_back() -> None:
    from datetime import datetime, timedelta, timezone

    from calque.session.client.views import human_left

    now = datetime(2026, 11, 30, tzinfo=timezone.utc)
    shown = [human_left(now + timedelta(seconds=s), now) for s in (3 * 3600 + 5 * 60 + 30, 90, 0, -5)]
    assert shown == ["3h5m", "1m30s", "0s", "0s"]
    assert parse_duration(shown[0]) == 3 * 3600 + 5 * 60  # `calque session extend --by 3h5m` reads it
